"""The running server and its command line: assembly of plugins, model manager, data plane and
listeners; `modelplex serve` and the admin client commands; the admin-address split; the status page.

The top layer: it may use every other part of the host, and nothing in the host imports it.
"""
