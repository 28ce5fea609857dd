"""OpenAI-compatible routes (models, completions, chat completions, embeddings) over the DataPlane:
they translate requests and answers, and hold no model logic."""
from .router import create_openai_router

__all__ = ["create_openai_router"]
