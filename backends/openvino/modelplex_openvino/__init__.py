"""The OpenVINO backend for modelplex (`backend: "openvino"`): OpenVINO IR and ONNX models on CPU/GPU/NPU."""
