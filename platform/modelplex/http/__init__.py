"""The HTTP front door: KServe v2 in Triton's dialect (JSON and binary tensors), over the data plane."""
