"""The shared-memory RPCs of `inference.GRPCInferenceService`, translated to the data plane's
registry (`modelplex.core.shared_memory`); mixed into the servicer."""
from __future__ import annotations

from tritonclient.grpc import service_pb2 as pb

from .status import guarded


class SharedMemoryRpcs:
    """System shared memory as registered regions; CUDA shared memory as Triton without GPUs answers."""

    @guarded
    async def SystemSharedMemoryStatus(self, request, context):
        response = pb.SystemSharedMemoryStatusResponse()
        for region in self.dataplane.shared_memory.status(request.name):
            response.regions[region["name"]].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(**region))
        return response

    @guarded
    async def SystemSharedMemoryRegister(self, request, context):
        self.dataplane.shared_memory.register(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    @guarded
    async def SystemSharedMemoryUnregister(self, request, context):
        self.dataplane.shared_memory.unregister(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    @guarded
    async def CudaSharedMemoryStatus(self, request, context):
        self.dataplane.shared_memory.cuda_status(request.name)  # no regions: raises for a named one
        return pb.CudaSharedMemoryStatusResponse()

    @guarded
    async def CudaSharedMemoryRegister(self, request, context):
        self.dataplane.shared_memory.cuda_register(request.name)  # always refused: no GPU
        return pb.CudaSharedMemoryRegisterResponse()

    @guarded
    async def CudaSharedMemoryUnregister(self, request, context):
        self.dataplane.shared_memory.cuda_unregister(request.name)
        return pb.CudaSharedMemoryUnregisterResponse()
