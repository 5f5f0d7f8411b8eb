"""ddtree-serve: an OpenAI-compatible HTTP server over the reference engine (FastAPI + uvicorn)."""
