"""The Conductor's REST API: the FastAPI app, its auth dependencies, schemas and routes."""
