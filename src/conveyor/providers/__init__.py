"""Model providers: adapters on the official SDKs, and a local OpenAI-compatible simulator.

The simulator lives in ``conveyor.providers.simulator`` and needs the ``sim``
extra (fastapi, uvicorn, openai); nothing here imports it.
"""
