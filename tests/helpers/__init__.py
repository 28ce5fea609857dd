"""Test code shared between test folders: server processes, clients, model builders, reference
checks. Importable as `helpers.<module>` (pytest's `pythonpath` puts tests/ on the path)."""
