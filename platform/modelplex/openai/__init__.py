"""OpenAI-compatible routes (models, completions, chat completions, embeddings, LoRA loading) over the
data plane: they translate requests and answers, and hold no model logic. Mounted on the HTTP port,
they reuse the HTTP door's body reading and SSE; never the gRPC door or the server assembly."""
from .router import create_openai_router

__all__ = ["create_openai_router"]
