"""Admin API: adapter management routers and authentication (not built yet)."""
