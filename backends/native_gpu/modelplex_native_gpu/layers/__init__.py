"""Transformer building blocks: RMSNorm, rotary embedding, paged attention."""
