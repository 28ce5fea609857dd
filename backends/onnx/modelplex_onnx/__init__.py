"""The ONNX Runtime backend for modelplex (`backend: "onnxruntime"`, platform `onnxruntime_onnx`)."""
