"""`inference.GRPCInferenceService` on top of the DataPlane: every RPC only translates messages."""
from __future__ import annotations

import asyncio

from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from ..core.errors import InvalidInput, ModelplexError, NotFound
from ..dataplane import DataPlane
from ..observability.logs import LOG_SETTINGS
from ..observability.trace_spans import share
from .codec import decode_request, encode_response
from .shared_memory import SharedMemoryRpcs
from .status import error_message, guarded

# Triton's stream parameters: the client asks for an empty last response; every response says if it is the last.
ENABLE_EMPTY_FINAL = "triton_enable_empty_final_response"
FINAL_RESPONSE = "triton_final_response"
FILE_PREFIX = "file:"
_MAX_SHARED_SPAN_ATTRIBUTES = 1024  # (method, model) pairs: clients choose the model names
_SPAN_NAMES = {method: share(method) for method in ("ModelInfer", "ModelStreamInfer")}


class InferenceServicer(SharedMemoryRpcs, service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, dataplane: DataPlane):
        self.dataplane = dataplane
        self._span_attributes: dict[tuple[str, str], dict] = {}

    # ---- health and metadata ------------------------------------------------------------
    @guarded
    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=self.dataplane.live())

    @guarded
    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=self.dataplane.ready())

    @guarded
    async def ModelReady(self, request, context):
        return pb.ModelReadyResponse(ready=self.dataplane.model_ready(request.name, request.version))

    @guarded
    async def ServerMetadata(self, request, context):
        return as_message(self.dataplane.metadata(), pb.ServerMetadataResponse)

    @guarded
    async def ModelMetadata(self, request, context):
        return as_message(self.dataplane.model_metadata(request.name, request.version), pb.ModelMetadataResponse)

    @guarded
    async def ModelConfig(self, request, context):
        return pb.ModelConfigResponse(config=self.dataplane.model_config(request.name, request.version))

    # ---- inference ----------------------------------------------------------------------
    @guarded
    async def ModelInfer(self, request, context):
        tracing = self.dataplane.tracing
        if tracing.enabled and tracing.sample(request.model_name):
            return await self._traced_infer(request, context)
        return await self._infer(request)

    async def _infer(self, request):
        """One unary infer, its message's size held in the server's request-memory budget meanwhile."""
        memory, size = self.dataplane.request_memory, request.ByteSize()
        memory.reserve(size)
        try:
            limits = self.dataplane.settings.tensor_limits
            return encode_response(await self.dataplane.infer(decode_request(request, limits)))
        finally:
            memory.release(size)

    async def _traced_infer(self, request, context):
        attributes = self._server_span_attributes("ModelInfer", request.model_name)
        with self.dataplane.tracing.request_span(_SPAN_NAMES["ModelInfer"], attributes,
                                                 context.invocation_metadata() or ()):
            return await self._infer(request)

    async def ModelStreamInfer(self, request_iterator, context):
        """Requests are served concurrently; responses go out as they come, errors as `error_message`.

        Bounded per stream: at most `grpc_stream_max_inflight` requests run and
        `grpc_stream_max_queued_responses` responses wait for the client; when either is full the stream
        stops reading requests, so gRPC's flow control holds the client back (a client that kept sending
        4 MB requests to a slow model and never read drove the server from 121 MB to 5.1 GB)."""
        settings = self.dataplane.settings
        outbox: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue(
            max(1, settings.grpc_stream_max_queued_responses))
        metadata = context.invocation_metadata() or ()
        reader = asyncio.create_task(self._read_stream(request_iterator, outbox, metadata))
        # A cancel that lands while grpc is sending leaves this generator suspended at `yield`, so its
        # `finally` would wait for garbage collection: the call ending stops the requests instead.
        context.add_done_callback(lambda _: reader.cancel())
        try:
            while (item := await outbox.get()) is not None:
                yield item
            await reader  # surfaces a broken request stream as the call's error
        finally:
            reader.cancel()

    async def _read_stream(self, request_iterator, outbox: asyncio.Queue, metadata) -> None:
        tasks: set[asyncio.Task] = set()
        slots = asyncio.Semaphore(max(1, self.dataplane.settings.grpc_stream_max_inflight))
        memory = self.dataplane.request_memory

        def done(task: asyncio.Task, size: int) -> None:
            tasks.discard(task)
            slots.release()
            memory.release(size)

        try:
            await slots.acquire()  # a slot before each read: none free, no read
            async for msg in request_iterator:
                size = msg.ByteSize()
                try:
                    memory.reserve(size)
                except ModelplexError as e:
                    slots.release()
                    await outbox.put(pb.ModelStreamInferResponse(error_message=e.message,
                                                                 infer_response=_echo_ids(msg)))
                    await slots.acquire()
                    continue
                one = self._stream_one(msg, outbox)
                tracing = self.dataplane.tracing
                if tracing.enabled and tracing.sample(msg.model_name):
                    one = self._traced_stream_one(msg, one, metadata)
                task = asyncio.create_task(one)
                tasks.add(task)
                task.add_done_callback(lambda t, size=size: done(t, size))
                await slots.acquire()
            while tasks:
                await asyncio.gather(*tasks)
        except asyncio.CancelledError:
            for task in tasks:
                task.cancel()
            raise
        except BaseException:
            for task in tasks:
                task.cancel()
            await outbox.put(None)
            raise
        await outbox.put(None)

    async def _traced_stream_one(self, msg: pb.ModelInferRequest, one, metadata) -> None:
        """One stream request inside its own server span (every request of a stream shares its parent)."""
        attributes = self._server_span_attributes("ModelStreamInfer", msg.model_name)
        with self.dataplane.tracing.request_span(_SPAN_NAMES["ModelStreamInfer"], attributes, metadata):
            await one

    def _server_span_attributes(self, method: str, model: str) -> dict:
        """A server span's attributes, one dict per method and model shared by their spans (recorded
        by reference, never changed)."""
        attributes = self._span_attributes.get((method, model))
        if attributes is None:
            attributes = {"rpc.system": "grpc", "rpc.method": method, "model": model}
            if len(self._span_attributes) < _MAX_SHARED_SPAN_ATTRIBUTES:
                self._span_attributes[(method, model)] = share(attributes)
        return attributes

    async def _stream_one(self, msg: pb.ModelInferRequest, outbox: asyncio.Queue) -> None:
        """Triton's flags: a non-decoupled model's one response is final; a decoupled model's responses
        are not, and its end is an empty final response when the request asks for one."""
        try:
            request = decode_request(msg, self.dataplane.settings.tensor_limits)
            config = self.dataplane.model_config(request.model_name, request.model_version)
            decoupled = config.model_transaction_policy.decoupled
            version = request.model_version
            async for response in self.dataplane.stream(request):
                version = response.model_version
                await outbox.put(stream_response(encode_response(response), is_final=not decoupled))
            if decoupled and request.parameters.get(ENABLE_EMPTY_FINAL):
                empty = pb.ModelInferResponse(model_name=request.model_name, model_version=version, id=request.id)
                await outbox.put(stream_response(empty, is_final=True))
        except Exception as e:
            await outbox.put(pb.ModelStreamInferResponse(error_message=error_message(e)))

    # ---- statistics and repository ------------------------------------------------------
    @guarded
    async def ModelStatistics(self, request, context):
        return as_message(self.dataplane.statistics(request.name, request.version), pb.ModelStatisticsResponse)

    @guarded
    async def RepositoryIndex(self, request, context):
        return as_message({"models": self.dataplane.repository_index(request.ready)}, pb.RepositoryIndexResponse)

    @guarded
    async def RepositoryModelLoad(self, request, context):
        config, files = load_parameters(request.parameters)
        await self.dataplane.load_model(request.model_name, config, files or None)
        return pb.RepositoryModelLoadResponse()

    @guarded
    async def RepositoryModelUnload(self, request, context):
        param = request.parameters.get("unload_dependents")
        await self.dataplane.unload_model(request.model_name, bool(param and param.bool_param))
        return pb.RepositoryModelUnloadResponse()

    # ---- run-time settings --------------------------------------------------------------
    @guarded
    async def TraceSetting(self, request, context):
        """Triton's message: every value a list of strings; an empty list clears a model's override."""
        tracing = self.dataplane.tracing
        model = request.model_name
        if model and not any(row["name"] == model for row in self.dataplane.repository_index()):
            raise NotFound(f"model '{model}' is not in the model repository")
        changes = {key: (list(v.value) if key == "trace_level" else v.value[0]) if v.value else None
                   for key, v in request.settings.items()}
        settings = tracing.update(changes, model) if changes else tracing.settings(model)
        response = pb.TraceSettingResponse()
        for key, value in settings.items():
            response.settings[key].value.extend(value if isinstance(value, list) else [value])
        return response

    @guarded
    async def LogSettings(self, request, context):
        changes = {key: getattr(v, v.WhichOneof("parameter_choice")) for key, v in request.settings.items()
                   if v.WhichOneof("parameter_choice")}
        settings = LOG_SETTINGS.update(changes) if changes else LOG_SETTINGS.settings()
        response = pb.LogSettingsResponse()
        for key, value in settings.items():
            field = {bool: "bool_param", int: "uint32_param", str: "string_param"}[type(value)]
            setattr(response.settings[key], field, value)
        return response


def _echo_ids(msg: pb.ModelInferRequest) -> pb.ModelInferResponse:
    """The names a refused stream request's error carries, so the client can tell which one it was."""
    return pb.ModelInferResponse(model_name=msg.model_name, model_version=msg.model_version, id=msg.id)


def stream_response(response: pb.ModelInferResponse, is_final: bool) -> pb.ModelStreamInferResponse:
    response.parameters[FINAL_RESPONSE].bool_param = is_final
    return pb.ModelStreamInferResponse(infer_response=response)


def as_message(data: dict, message_type):
    """A data-plane answer (Triton's JSON shape) as its gRPC message; keys gRPC cannot carry are left out."""
    return json_format.ParseDict(data, message_type(), ignore_unknown_fields=True)


def load_parameters(params) -> tuple[str | None, dict[str, bytes]]:
    """A load request's `config` (JSON text) and `file:<path>` contents, as tritonclient's load_model sends them."""
    config, files = None, {}
    for key, p in params.items():
        kind = p.WhichOneof("parameter_choice")
        if key == "config":
            if kind != "string_param":
                raise InvalidInput("load parameter 'config' must be a string holding the model config JSON")
            config = p.string_param
        elif key.startswith(FILE_PREFIX) and len(key) > len(FILE_PREFIX):
            if kind != "bytes_param":
                raise InvalidInput(f"load parameter '{key}' must carry the file's bytes (bytes_param)")
            files[key[len(FILE_PREFIX):]] = p.bytes_param
        else:
            raise InvalidInput(f"unknown load parameter '{key}' (expected 'config' or 'file:<path>')")
    return config, files
