"""The process that runs one OpenVINO GenAI `ContinuousBatchingPipeline` (`python -m modelplex_openvino.llm_worker FD`).

Its own process because the binding's `step()` keeps the GIL for a whole model run: in the server
it would stop the event loop (every other model's requests, health checks) for each step. Messages
on the socket FD are pickled tuples (see `LLMWorkerClient`): in `add`, `cancel`, `load_adapter`,
`unload_adapter`; out `ready`/`failed` once, then `events` after each step (each request's text
deltas, errors and endings, plus the engine's occupancy) and one answer per adapter message.
"""
from __future__ import annotations

import sys
import time
from multiprocessing.connection import Connection

from .llm_generation import SamplingError, generation_config
from .llm_scheduling import AdapterGroups

FINISH_REASONS = {"STOP": "stop", "LENGTH": "length"}
STATS_INTERVAL_SECONDS = 0.5  # an idle worker still reports its occupancy this often, at most


class TextStream:
    """Token ids to text deltas, holding back a partial UTF-8 character (decoded as U+FFFD) until it completes.
    Only a window of recent tokens is decoded again, so a long answer costs O(window) per step."""

    def __init__(self, tokenizer, skip_special_tokens: bool):
        self.tokenizer, self.skip = tokenizer, skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = self.read_offset = 0

    def push(self, new_ids: list[int], final: bool = False) -> str:
        """The text `new_ids` add; `final`: the answer ends here, so nothing is held back."""
        self.ids += new_ids
        decode = self.tokenizer.decode
        before = decode(self.ids[self.prefix_offset:self.read_offset], skip_special_tokens=self.skip)
        after = decode(self.ids[self.prefix_offset:], skip_special_tokens=self.skip)
        if (after.endswith("\ufffd") and not final) or len(after) <= len(before):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return after[len(before):]


class Request:
    """One request from arrival to its last event. `handle` is None until it is added to the pipeline."""

    def __init__(self, request_id: int, prompt_ids: list[int], config, lora: str, tokenizer, skip_special: bool):
        self.request_id, self.prompt_ids, self.config, self.lora = request_id, prompt_ids, config, lora
        self.handle = None
        self.streams: dict[int, TextStream] = {}  # by OpenVINO's sequence id
        self.num_generated: dict[int, int] = {}
        self._tokenizer, self._skip = tokenizer, skip_special
        self.wants_logprobs = config.logprobs > 0

    def index_of(self, sequence_id: int) -> int:
        if sequence_id not in self.streams:
            self.streams[sequence_id] = TextStream(self._tokenizer, self._skip)
            self.num_generated[sequence_id] = 0
        return list(self.streams).index(sequence_id)


class Engine:
    """The pipeline, the requests in it and the ones waiting for their adapter's turn."""

    def __init__(self, settings: dict):
        import openvino_genai as og

        self.og, self.settings = og, settings
        self.adapter_paths: dict[str, tuple[str, float]] = dict(settings["adapters"])  # name -> (file, alpha)
        self.pipe = self._build(self.adapter_paths)
        self.tokenizer = self.pipe.get_tokenizer()
        self.eos_token_id = self.tokenizer.get_eos_token_id()
        self.groups = AdapterGroups()
        self.requests: dict[int, Request] = {}
        self.max_model_len = settings["max_model_len"]

    def _build(self, adapters: dict[str, tuple[str, float]]):
        og = self.og
        scheduler = og.SchedulerConfig()
        for key, value in self.settings["scheduler"].items():
            setattr(scheduler, key, value)
        properties = dict(self.settings["properties"])
        if adapters:
            # The paged prefix cache is not keyed by adapter: a prompt cached under one adapter would
            # be reused under another and give its text. With adapters registered it stays off.
            scheduler.enable_prefix_caching = False
            self.adapter_objects = {name: og.Adapter(path) for name, (path, _) in adapters.items()}
            config = og.AdapterConfig()
            for name, adapter in self.adapter_objects.items():
                config.add(adapter, adapters[name][1])
            properties["adapters"] = config
        else:
            self.adapter_objects = {}
        self.applied_lora: str | None = None
        return og.ContinuousBatchingPipeline(self.settings["path"], scheduler, self.settings["device"], properties)

    # ---- requests -----------------------------------------------------------------------
    def add(self, request_id: int, inputs: dict) -> list[tuple]:
        """Tokenize and check a new request; it then waits for its adapter group's turn."""
        try:
            prompt_ids = self._prompt_ids(inputs)
            if len(prompt_ids) >= self.max_model_len:
                raise SamplingError("prompt", f"{len(prompt_ids)} tokens; the context length (max_model_len) is "
                                    f"{self.max_model_len}")
            config = generation_config(inputs["sampling"], len(prompt_ids), self.max_model_len, self.eos_token_id)
        except SamplingError as e:
            return [(request_id, "error", (e.field, str(e)))]
        skip = inputs["sampling"].get("skip_special_tokens", True)
        request = Request(request_id, prompt_ids, config, inputs["lora"], self.tokenizer, skip is not False)
        self.requests[request_id] = request
        self.groups.add(request.lora, request_id)
        return []

    def _prompt_ids(self, inputs: dict) -> list[int]:
        text = inputs["text"]
        if inputs["messages"] is not None:
            if not self.tokenizer.chat_template:
                raise SamplingError("messages", "this model has no chat template; send text_input")
            try:
                text = self.tokenizer.apply_chat_template(inputs["messages"], add_generation_prompt=True)
            except RuntimeError as e:
                raise SamplingError("messages", f"the chat template refused them: {e}") from None
        ids = [int(t) for t in self.tokenizer.encode(text, add_special_tokens=False).input_ids.data[0]]
        if not ids:
            raise SamplingError("prompt", "is empty")
        return ids

    def cancel(self, request_id: int) -> None:
        request = self.requests.get(request_id)
        if request is None:
            return
        if request.handle is None:
            self.groups.discard(request.lora, request_id)
            del self.requests[request_id]
        else:
            request.handle.cancel()  # the pipeline drops it on its next step

    # ---- one turn of the loop ----------------------------------------------------------
    def admit(self) -> None:
        """Add to the pipeline the waiting requests whose adapter set may run now (see AdapterGroups)."""
        import numpy as np
        import openvino as ov

        lora, request_ids = self.groups.next_admissions(not self.is_pipeline_empty(),
                                                        single_group=not self.adapter_objects)
        if not request_ids:
            return
        if self.adapter_objects and lora != self.applied_lora:
            self._apply_adapter(lora)
        for request_id in request_ids:
            request = self.requests[request_id]
            ids = ov.Tensor(np.array([request.prompt_ids], dtype=np.int64))
            request.handle = self.pipe.add_request(request_id, ids, request.config)

    def _apply_adapter(self, lora: str) -> None:
        """OpenVINO GenAI sets the adapters of its infer request only in `generate()` (which needs an idle
        pipeline, as it is here), never per request: a one-token generate under `lora`'s adapter set
        leaves them set for the requests added next."""
        import numpy as np
        import openvino as ov

        while self.pipe.has_non_finished_requests():  # cancelled requests the pipeline has not dropped yet
            self.pipe.step()
        config = self.og.GenerationConfig()
        config.max_new_tokens = 1
        config.adapters = self._adapter_config(lora)
        self.pipe.generate([ov.Tensor(np.array([[self.eos_token_id]], dtype=np.int64))], [config])
        self.applied_lora = lora

    def _adapter_config(self, lora: str):
        config = self.og.AdapterConfig()
        if lora:
            config.add(self.adapter_objects[lora], self.adapter_paths[lora][1])
        return config

    def step(self) -> list[tuple]:
        if self.pipe.has_non_finished_requests():
            self.pipe.step()
        return self._collect()

    def _collect(self) -> list[tuple]:
        events = []
        for request in [r for r in self.requests.values() if r.handle is not None]:
            handle = request.handle
            while handle.can_read():
                for sequence_id, output in handle.read().items():
                    events.append(self._delta(request, sequence_id, output))
            status = handle.get_status().name
            if status != "RUNNING":
                if status == "IGNORED":  # refused by the scheduler (no KV room for the prompt)
                    events.append((request.request_id, "error", ("prompt", "prompt: does not fit the KV cache")))
                elif status != "FINISHED":  # cancelled: its stream is gone already
                    events.append((request.request_id, "cancelled", None))
                del self.requests[request.request_id]
        return events

    def _delta(self, request: Request, sequence_id: int, output) -> tuple:
        index = request.index_of(sequence_id)
        new_ids = list(output.generated_ids)
        request.num_generated[sequence_id] += len(new_ids)
        text = request.streams[sequence_id].push(new_ids)
        finish = FINISH_REASONS.get(output.finish_reason.name)
        if finish:
            text += request.streams[sequence_id].push([], final=True)
        delta = {"index": index, "text": text, "token_ids": new_ids, "num_new_tokens": len(new_ids), "logprobs": None,
                 "finish_reason": finish, "num_input_tokens": len(request.prompt_ids),
                 "num_output_tokens": request.num_generated[sequence_id],
                 "num_sequences": request.config.num_return_sequences}
        if request.wants_logprobs:
            delta["logprobs"] = list(output.generated_log_probs)
            delta["tokens"] = [self.tokenizer.decode([t], skip_special_tokens=False) for t in new_ids]
        return (request.request_id, "delta", delta)

    def stats(self) -> dict:
        metrics = self.pipe.get_metrics()
        running = sum(r.handle is not None for r in self.requests.values())
        return {"num_running": running, "num_waiting": len(self.requests) - running,
                "kv_cache_usage": metrics.cache_usage, "applied_adapter": self.applied_lora}

    # ---- adapters ------------------------------------------------------------------------
    def load_adapter(self, name: str, path: str, alpha: float) -> str | None:
        """Rebuild the pipeline with `name` registered (OpenVINO GenAI fixes the adapter set when it builds
        the pipeline); only called with no request in the pipeline. The reason when it cannot."""
        adapters = {**self.adapter_paths, name: (path, alpha)}
        old = (self.pipe, self.adapter_objects, self.applied_lora)
        try:
            self.pipe = self._build(adapters)
        except RuntimeError as e:
            self.pipe, self.adapter_objects, self.applied_lora = old
            return str(e).strip().splitlines()[-1]
        self.adapter_paths = adapters
        return None

    def is_pipeline_empty(self) -> bool:
        return all(r.handle is None for r in self.requests.values())

    def has_requests_of(self, lora: str) -> bool:
        return any(r.lora == lora for r in self.requests.values())


def serve(conn: Connection) -> None:
    settings = conn.recv()
    try:
        engine = Engine(settings)
    except Exception as e:
        conn.send(("failed", str(e).strip().splitlines()[-1] if str(e).strip() else repr(e)))
        return
    conn.send(("ready", {"eos_token_id": engine.eos_token_id}))
    Loop(conn, engine).run()


class Loop:
    """Messages in, one step, events out, until the server closes the socket."""

    def __init__(self, conn: Connection, engine: Engine):
        self.conn, self.engine = conn, engine
        self.adapter_loads: list[tuple[str, str, float]] = []  # wait for an empty pipeline
        self.adapter_unloads: list[str] = []  # wait until the adapter's requests are done
        self.last_stats = 0.0

    def run(self) -> None:
        try:
            while True:
                busy = bool(self.engine.requests) or self.adapter_loads or self.adapter_unloads
                if self.conn.poll(0 if busy else STATS_INTERVAL_SECONDS):
                    self._receive_all()
                events = self._turn()
                now = time.monotonic()
                if events or now - self.last_stats >= STATS_INTERVAL_SECONDS:
                    self.conn.send(("events", events, self.engine.stats()))
                    self.last_stats = now
        except (EOFError, BrokenPipeError, ConnectionResetError):
            return  # the server went away

    def _receive_all(self) -> None:
        while self.conn.poll(0):
            message = self.conn.recv()
            kind = message[0]
            if kind == "add":
                events = self.engine.add(message[1], message[2])
                if events:
                    self.conn.send(("events", events, self.engine.stats()))
            elif kind == "cancel":
                self.engine.cancel(message[1])
            elif kind == "load_adapter":
                self.adapter_loads.append(message[1:])
            elif kind == "unload_adapter":
                self.adapter_unloads.append(message[1])

    def _turn(self) -> list[tuple]:
        engine = self.engine
        if self.adapter_loads and engine.is_pipeline_empty():
            for name, path, alpha in self.adapter_loads:
                self.conn.send(("adapter_loaded", name, engine.load_adapter(name, path, alpha)))
            self.adapter_loads.clear()
        for name in [n for n in self.adapter_unloads if not engine.has_requests_of(n)]:
            self.adapter_unloads.remove(name)
            self.conn.send(("adapter_unloaded", name))
        if not self.adapter_loads:  # an adapter waiting to load holds new requests back until it has
            engine.admit()
        return engine.step()


def main(argv: list[str]) -> None:
    serve(Connection(int(argv[1])))


if __name__ == "__main__":
    main(sys.argv)
