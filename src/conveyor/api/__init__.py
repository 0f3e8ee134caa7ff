"""The HTTP service: a FastAPI app over the same service functions as the command line.

``create_app(ApiSettings(...))`` builds it; ``conveyor serve`` runs it under uvicorn. See the README's
"HTTP API" section for the endpoints, their status codes and JSON fields.
"""

from conveyor.api.app import create_app
from conveyor.api.settings import ApiSettings

__all__ = ["ApiSettings", "create_app"]
