"""The web layer: FastAPI routes, request/response schemas, settings and the job runner."""
