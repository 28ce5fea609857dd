"""Make the backend importable from a source checkout and share the real-model fixtures."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "backends", "native_gpu"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
