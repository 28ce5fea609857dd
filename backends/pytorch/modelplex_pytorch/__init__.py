"""The PyTorch backend for modelplex (`backend: "pytorch"`, platform `pytorch_libtorch`): TorchScript
`model.pt` files and `torch.export` programs (`model.pt2`)."""
