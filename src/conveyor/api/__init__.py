"""The HTTP service: a FastAPI app over the same service functions as the command line.

``create_app(ApiSettings(...))`` builds it; ``conveyor serve`` runs it under uvicorn. See
docs/how-to/http-api.md and the generated docs/reference/http.md for the endpoints, their status codes and JSON
fields.
"""

from conveyor.api.app import create_app
from conveyor.api.settings import ApiSettings

__all__ = ["ApiSettings", "create_app"]
