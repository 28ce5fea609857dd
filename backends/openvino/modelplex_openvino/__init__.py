"""OpenVINO backend: Intel CPU/GPU/NPU for classic models and OpenVINO GenAI LLMs (not built yet)."""
