"""The host's vocabulary, which every other layer uses: typed errors, KServe tensors and requests, the
backend contract and the hooks plugins implement, the plugin manager, server settings, the parameter
parsers, and the API-group table access policies read.

Imports nothing else of modelplex, and no web or RPC framework: everything in it is plain data and
contracts.
"""
