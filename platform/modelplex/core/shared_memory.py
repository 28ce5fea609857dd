"""Triton's system shared-memory extension: regions a client registers (a POSIX shared-memory object
the server maps), kept per server. `shm_tensors` reads inputs from them and writes outputs into them.

A key is a POSIX shm name (`/name`), never a path: it is opened under /dev/shm without following
links, and only a regular file is mapped. A region being read or written by a request stays mapped
until that request lets go of it, even once unregistered (the mapping is closed by whoever holds it
last), so unregistering never pulls memory from under a running request.
"""
from __future__ import annotations

import mmap
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from .errors import InvalidInput, NotFound, Unsupported

SHM_ROOT = Path("/dev/shm")
# Triton reserves this prefix for its Python backend's own regions; refused as Triton does.
RESERVED_PREFIX = "triton_python_backend_shm_region_"
DISABLED = "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
_MAX_NAME = 255  # NAME_MAX


@dataclass(eq=False)
class Region:
    """One registered region: `byte_size` bytes from `offset` of the object `key`."""

    name: str
    key: str
    offset: int
    byte_size: int
    _map: mmap.mmap = field(repr=False)

    def status(self) -> dict:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def view(self, offset: int, byte_size: int) -> memoryview:
        """`byte_size` bytes at `offset` within the region (bounds checked as Triton words them)."""
        if type(offset) is not int or offset < 0 or offset >= self.byte_size:
            raise InvalidInput(f"Invalid offset for shared memory region: '{self.name}'")
        if type(byte_size) is not int or byte_size < 0 or offset + byte_size > self.byte_size:
            raise InvalidInput(f"Invalid offset + byte size for shared memory region: '{self.name}'")
        start = self.offset + offset
        return memoryview(self._map)[start:start + byte_size]

    def close(self) -> None:
        """Unmap now unless a request still views the region; then its last user's release does."""
        try:
            self._map.close()
        except BufferError:
            pass  # exported views hold the mapping; it is unmapped when they and this object are gone


class SharedMemoryRegistry:
    """The system shared-memory regions of one server, by name (Triton's per-server namespace)."""

    def __init__(self, allowed: bool = False):
        self.allowed = allowed  # --allow-client-shm
        self._regions: dict[str, Region] = {}

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self._check_allowed()
        if type(name) is not str or not name:
            raise InvalidInput("'region name' is necessary to register system shared memory region")
        if type(key) is not str:
            raise InvalidInput("Shared memory register request has no 'key' field")
        for what, value in (("offset", offset), ("byte_size", byte_size)):
            if type(value) is not int or value < 0:
                raise InvalidInput(f"shared memory register request: '{what}' must be a non-negative integer")
        path = _object_path(name, key)
        if name in self._regions:
            raise InvalidInput(f"shared memory region '{name}' already in manager")
        self._regions[name] = Region(name, key, offset, byte_size, _map(path, name, key, offset, byte_size))

    def unregister(self, name: str = "") -> None:
        """One region, or every region when `name` is empty; an unknown name is not an error (as Triton)."""
        self._check_allowed()
        names = [name] if name else list(self._regions)
        for each in names:
            region = self._regions.pop(each, None)
            if region is not None:
                region.close()

    def status(self, name: str = "") -> list[dict]:
        if not name:
            return [region.status() for region in self._regions.values()]
        return [self.get(name, "Unable to find system shared memory region: '{}'").status()]

    def get(self, name: str, missing: str = "Unable to find shared memory region: '{}'") -> Region:
        region = self._regions.get(name)
        if region is None:
            raise NotFound(missing.format(name))
        return region

    def close(self) -> None:
        self._regions, regions = {}, self._regions
        for region in regions.values():
            region.close()

    # CUDA shared memory: this server has no GPU memory to share, so it answers as Triton built
    # without GPU support does: no regions, registration refused, unregistering a no-op.
    def cuda_status(self, name: str = "") -> list[dict]:
        if name:
            raise NotFound(f"Unable to find cuda shared memory region: '{name}'")
        return []

    def cuda_register(self, name: str) -> None:
        self._check_allowed()
        raise InvalidInput(f"failed to register CUDA shared memory region: '{name}', GPUs not supported")

    def cuda_unregister(self, name: str = "") -> None:
        self._check_allowed()

    def _check_allowed(self) -> None:
        if not self.allowed:
            raise Unsupported(DISABLED)


def _object_path(name: str, key: str) -> Path:
    """/dev/shm/<key> for a POSIX shm name: leading slashes dropped (as shm_open does), then one
    plain file name, never a path."""
    base = key.lstrip("/")
    if not base or "/" in base or base in (".", "..") or "\0" in base or len(base) > _MAX_NAME:
        raise InvalidInput(f"cannot register shared memory region '{name}' - invalid shm key '{key}'")
    if base.startswith(RESERVED_PREFIX):
        raise InvalidInput(f"cannot register shared memory region '{name}' with key '{key}' as the key "
                           f"contains the reserved prefix '{RESERVED_PREFIX}'")
    return SHM_ROOT / base


def _map(path: Path, name: str, key: str, offset: int, byte_size: int) -> mmap.mmap:
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        raise InvalidInput(f"Unable to open shared memory region: '{key}'") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InvalidInput(f"Unable to open shared memory region: '{key}'")
        if byte_size == 0 or offset + byte_size > info.st_size:
            raise InvalidInput(f"failed to register shared memory region '{name}': invalid args")
        # Mapped from the object's start: mmap offsets must be page-aligned, a region's need not be.
        return mmap.mmap(fd, offset + byte_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except OSError as e:
        raise InvalidInput(f"failed to register shared memory region '{name}': {e.strerror}") from None
    finally:
        os.close(fd)
