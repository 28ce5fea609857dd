"""Model lifecycle: read configs, pick versions, load/unload/reload, poll the repository.

Loads never block the event loop (every step that reads files or runs plugin or user code runs on a
thread of its own, `load_threads`) and a reload brings new versions up before old ones go away, so
requests in between keep being served.
"""
from __future__ import annotations

import asyncio
import contextvars
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.backend import BackendSpec, ModelContext
from ..core.errors import InternalError, InvalidInput, ModelplexError, NotFound, Unavailable
from ..core.settings import ServerConfig
from ..observability.stats import ModelStats
from . import config as mc
from .adapters import AdapterSource, static_sources
from .load_threads import LoadTimeout, in_thread
from .memory import release_freed_memory_soon
from .repository import ModelLocation, ModelRepository, check_name, confined
from .version import ModelVersion

if TYPE_CHECKING:
    from ..dataplane import DataPlane

log = logging.getLogger(__name__)
# Models whose load is waiting on this one (a model loads the models it depends on first, e.g. an
# ensemble its steps): a name already in the chain means models that depend on each other.
_LOAD_CHAIN: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("load_chain", default=())


@dataclass
class ModelEntry:
    """Everything known about one model name: its live versions and its last load error."""

    name: str
    versions: dict[int, ModelVersion] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)  # version -> reason, for the index
    error: str = ""
    fingerprint: str = ""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    override_dir: Path | None = None
    loading: dict[int, ModelVersion] = field(default_factory=dict)  # versions being loaded, for the index
    # The repository folder's fingerprint at the last load from it, whatever its outcome: poll mode
    # reloads (and logs a failure again) only once the files change.
    polled_fingerprint: str = ""


class ModelManager:
    def __init__(self, settings: ServerConfig, backends: dict[str, BackendSpec], dataplane: DataPlane | None = None):
        self.settings, self.backends = settings, backends
        self.repository = ModelRepository(settings.model_repositories)
        self.entries: dict[str, ModelEntry] = {}
        self._poll_task: asyncio.Task | None = None
        # The startup load (the models of `--model-control-mode` / `--load-model`) has ended, whatever
        # its outcome: until then the server is not ready. Names that failed it, with their reasons.
        self.started = False
        self.startup_failures: dict[str, str] = {}
        self.dataplane = dataplane  # the DataPlane that owns this manager, given to backends (ensembles, BLS)
        for backend in settings.backend_config:
            if backend not in backends:
                log.warning("--backend-config names backend '%s', which is not installed (installed: %s): ignored",
                            backend, ", ".join(sorted(backends)) or "none")

    # ---- lookup -------------------------------------------------------------------------
    def get(self, name: str, version: str = "") -> ModelVersion:
        """The READY version asked for, or the highest READY one when `version` is empty."""
        entry = self.entries.get(name)
        if entry is None or not entry.versions:
            # No repository scan here: this path is reachable by any client, as often as it likes.
            # Triton's words, which its clients and tests match.
            raise NotFound(f"Request for unknown model: '{name}' is not found" if entry is None else
                           f"Request for unknown model: '{name}' has no available versions")
        if version:
            if not (version.isascii() and version.isdigit()):  # isdigit alone passes '²'
                raise InvalidInput(f"invalid model version '{version}'")
            mv = entry.versions.get(int(version))
            if mv is None:
                raise NotFound(f"Request for unknown model: '{name}' version {version} is not found")
        else:
            ready = [v for v in entry.versions.values() if v.is_ready]
            if not ready:
                raise Unavailable(f"Request for unknown model: '{name}' has no available versions")
            mv = max(ready, key=lambda v: v.version)
        return mv

    def loaded_stats(self):
        """Statistics of every live model version (what /metrics exports)."""
        return [mv.stats for e in list(self.entries.values()) for mv in list(e.versions.values())]

    def _known(self) -> set[str]:
        try:
            return set(self.repository.scan())
        except OSError:
            return set()

    def is_ready(self) -> bool:
        """All models that were asked for are READY (what --strict-readiness requires)."""
        return all(e.versions and not e.error and all(v.is_ready for v in e.versions.values())
                   for e in self.entries.values())

    def index(self, ready_only: bool = False) -> list[dict]:
        rows = []
        for name in sorted(self._known() | set(self.entries)):
            entry = self.entries.get(name)
            loading = {} if entry is None or ready_only else {
                v: mv for v, mv in entry.loading.items() if v not in entry.versions}
            if entry is None or (not entry.versions and not entry.failed and not loading):
                if not ready_only:
                    rows.append({"name": name} | ({"state": "UNAVAILABLE", "reason": entry.error}
                                                  if entry and entry.error else {}))
                continue
            for version, mv in sorted(loading.items()):  # LOADING, with its progress as the reason
                rows.append({"name": name, "version": str(version), "state": mv.state.value, "reason": mv.reason})
            for version, mv in sorted(entry.versions.items()):
                if not ready_only or mv.is_ready:
                    rows.append({"name": name, "version": str(version), "state": mv.state.value,
                                 "reason": mv.reason or entry.error})
            if not ready_only:
                for version, reason in sorted(entry.failed.items()):
                    if version not in entry.versions:
                        rows.append({"name": name, "version": str(version), "state": "UNAVAILABLE", "reason": reason})
        return rows

    # ---- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        """Load the startup set (every model, or `--load-model`'s in explicit mode); failures are
        logged and kept in `startup_failures`. Then the table of what loaded, and polling if asked."""
        mode = self.settings.model_control_mode
        names = list(await asyncio.to_thread(self.repository.scan))
        if mode == "explicit":
            wanted = names if "*" in self.settings.load_models else list(dict.fromkeys(self.settings.load_models))
        else:
            wanted = names
        # --model-load-thread-count: how many models load at once (their steps, e.g. an ensemble's,
        # load inside their user's turn, so nested loads never wait for a turn of their own)
        turns = asyncio.Semaphore(max(1, self.settings.model_load_thread_count))

        async def load_in_turn(name: str) -> str | None:
            async with turns:
                return await self._load_logged(name)

        results = await asyncio.gather(*(load_in_turn(n) for n in wanted))
        self.startup_failures = {n: reason for n, reason in zip(wanted, results) if reason is not None}
        self.started = True
        log.info("startup load ended: %d model(s) loaded, %d failed\n%s", len(wanted) - len(self.startup_failures),
                 len(self.startup_failures), self.table())
        if mode == "poll":
            self._poll_task = asyncio.create_task(self._poll_loop())

    def table(self) -> str:
        """The repository index as a table for the log: model, version, state, reason."""
        rows = [(r["name"], r.get("version", "-"), r.get("state", "-"), r.get("reason", "")) for r in self.index()]
        header = ("MODEL", "VERSION", "STATE", "REASON")
        widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(3)]
        return "\n".join("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)) + "  " + row[3]
                         for row in [header, *rows])

    async def stop(self) -> None:
        if self._poll_task:
            self._poll_task.cancel()
        await asyncio.gather(*(self._unload_entry(n) for n in list(self.entries)), return_exceptions=True)

    async def _load_logged(self, name: str) -> str | None:
        """Load `name`, logging a failure; returns its reason (None when it loaded)."""
        try:
            await self.load(name)
        except ModelplexError as e:
            log.error("%s", e.message)  # "failed to load '<name>': ..."
            return e.message
        return None

    async def load(self, name: str, config_json: str | None = None, files: dict[str, bytes] | None = None) -> None:
        """Load or reload `name` (optionally with an overriding config and files, as Triton's load API)."""
        check_name(name)
        chain = _LOAD_CHAIN.get()
        if name in chain:
            raise InvalidInput(f"models use each other: {' -> '.join(chain + (name,))}")
        token = _LOAD_CHAIN.set(chain + (name,))
        try:
            if not files and name not in self.entries:
                self.repository.check_exists(name)  # an unknown name is NotFound before any state is kept for it
            entry = self.entries.setdefault(name, ModelEntry(name))
            await self._load_locked(entry, name, config_json, files)
        except ModelplexError as e:
            if not chain and not e.message.startswith("failed to load"):  # what Triton's clients look for
                e.message = f"failed to load '{name}': {e.message}"
                e.args = (e.message,)
            raise
        finally:
            _LOAD_CHAIN.reset(token)
            release_freed_memory_soon()

    async def _load_locked(self, entry: ModelEntry, name: str, config_json: str | None,
                           files: dict[str, bytes] | None) -> None:
        async with entry.lock:
            scratch = None
            try:
                if files:
                    scratch = await asyncio.to_thread(self._write_override, name, config_json, files)
                    location = ModelLocation(name, scratch)
                else:
                    location = await asyncio.to_thread(self.repository.locate, name)
                    entry.polled_fingerprint = await asyncio.to_thread(location.fingerprint)
                await self._load_versions(entry, location, config_json)
            except ModelplexError as e:
                entry.error = e.message
                await asyncio.to_thread(self._drop, scratch)  # the versions serving keep their own files
                raise
            except Exception as e:
                entry.error = f"failed to load '{name}': {e}"
                log.exception("loading %s", name)
                await asyncio.to_thread(self._drop, scratch)
                raise InvalidInput(entry.error) from e
            # Loaded: the previous override's files are no longer anyone's.
            if entry.override_dir is not None and entry.override_dir != scratch:
                await asyncio.to_thread(self._drop, entry.override_dir)
            entry.override_dir = scratch

    def _write_override(self, name: str, config_json: str | None, files: dict[str, bytes]) -> Path:
        """The load request's `file:` contents in a new folder of their own, complete before anything
        reads them (a failed or partial write never replaces what serves). Confined, size-limited."""
        if config_json is None:
            raise InvalidInput("a load request with files must also carry a 'config'")
        if sum(len(content) for content in files.values()) > self.settings.load_file_max_bytes:
            raise InvalidInput(f"files in the load request exceed the size limit of "
                               f"{self.settings.load_file_max_bytes} bytes")
        scratch = Path(tempfile.mkdtemp(prefix=f"modelplex-{name}-"))
        try:
            for rel, content in files.items():
                target = confined(scratch, rel)
                try:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(content)
                except OSError as e:  # e.g. a name longer than NAME_MAX; Triton's code and words, no server path
                    raise InternalError(f"failed to load '{name}', failed to poll from model repository: "
                                        f"file '{rel[:64]}' cannot be written ({e.strerror})") from None
        except BaseException:
            self._drop(scratch)
            raise
        return scratch

    @staticmethod
    def _drop(folder: Path | None) -> None:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)

    async def _load_versions(self, entry: ModelEntry, location: ModelLocation, config_json: str | None) -> None:
        timeout = self.settings.model_load_timeout_secs or None
        deadline = None if timeout is None else time.monotonic() + timeout
        late = (f"model '{entry.name}' did not finish loading within {timeout:g} s (--model-load-timeout-secs)"
                if timeout else "")
        try:
            config, spec = await in_thread(lambda: self._read_config(location, config_json), f"{entry.name}-config",
                                           deadline, late)
            await self._load_dependencies(entry.name, config, spec)
            # Auto-completion runs plugin (and, for Python models, user) code: serialized on a backend's first use.
            first_use = spec.name if spec.first_use_alone else None
            new, keep, fingerprint = await in_thread(lambda: self._prepare(entry, location, config), entry.name,
                                                     deadline, late, backend=first_use)
        except LoadTimeout as e:
            raise Unavailable(e.message) from None
        entry.loading = new
        try:
            results = await asyncio.gather(*(mv.load(timeout, deadline) for mv in new.values()),
                                           return_exceptions=True)
        finally:
            entry.loading = {}
        failures = {v: r for v, r in zip(new, results) if isinstance(r, BaseException)}
        if failures:
            for v, mv in new.items():
                if v not in failures:
                    await mv.unload(0)
            reasons = {v: f"{type(e).__name__}: {e}" if not isinstance(e, ModelplexError) else e.message
                       for v, e in failures.items()}
            if not entry.versions:
                entry.failed = reasons
            v, reason = next(iter(reasons.items()))
            raise InvalidInput(f"failed to load '{entry.name}' version {v}: {reason}")
        old_versions = [mv for v, mv in entry.versions.items() if keep.get(v) is not mv]
        entry.versions = dict(sorted((keep | new).items()))
        entry.failed, entry.error = {}, ""
        entry.fingerprint = fingerprint
        for mv in old_versions:
            await self._retire(mv)
        if new and old_versions:
            await self._rebuild_users(entry.name)

    def _read_config(self, location: ModelLocation, config_json: str | None) -> tuple[object, BackendSpec]:
        """The model's config (the load request's, or its config.pbtxt) and its backend (on a thread)."""
        config = (mc.parse_json(config_json) if config_json is not None
                  else mc.load_config_file(location.config_path))
        self._check_name(config, location)
        return config, self._backend_for(config, location)

    def _prepare(self, entry: ModelEntry, location: ModelLocation, config) -> tuple[dict, dict, str]:
        """Complete the config, pick its versions and build the new ones (on a thread): (new versions
        to load, ready versions kept as they are, the folder's fingerprint)."""
        spec = self._complete(config, location)
        versions = mc.select_versions(config, location.versions())
        if not versions:
            raise InvalidInput(f"model '{entry.name}' has no version folder that its version_policy selects")
        keep, new = {}, {}
        for v in versions:
            fp = location.fingerprint(v) + mc.to_json(config)
            old = entry.versions.get(v)
            if old is not None and old.is_ready and old.fingerprint == fp:
                keep[v] = old
            else:
                new[v] = self._new_version(entry.name, v, location, config, spec, fp)
        return new, keep, location.fingerprint()

    # ---- dependencies (an ensemble's steps): they load first and cannot go while a user is loaded
    async def _load_dependencies(self, name: str, config, spec: BackendSpec) -> None:
        """Load the models `name` depends on (its backend's `dependencies`) that are not ready yet,
        as Triton loads an ensemble's steps."""
        for dependency in spec.dependencies(config) if spec.dependencies else ():
            model = dependency.model
            try:
                entry = self.entries.get(model)
                if model == name or (entry is not None and name in self._dependencies_of(model, transitive=True)):
                    raise InvalidInput(f"models use each other: '{model}' uses '{name}'")
                if entry is None or not any(mv.is_ready for mv in entry.versions.values()):
                    await self.load(model)
            except ModelplexError as e:
                kind = config.platform or spec.name
                raise InvalidInput(f"{kind} '{name}' {dependency.role} (model '{model}'): {e.message}") from None

    def _dependencies_of(self, name: str, transitive: bool = False) -> set[str]:
        """Models the loaded versions of `name` depend on (and, transitively, what those depend on)."""
        entry = self.entries.get(name)
        found = {d.model for mv in (entry.versions.values() if entry else ()) if mv.spec.dependencies
                 for d in mv.spec.dependencies(mv.config)}
        if transitive:
            for model in list(found):
                found |= self._dependencies_of(model, transitive=True)
        return found

    async def _rebuild_users(self, name: str) -> None:
        """`name` came back with new versions (maybe other inputs or outputs): the models using it (an
        ensemble) build new instances on their unchanged configs, which checks their steps again. One that no
        longer fits turns UNAVAILABLE with the reason now, instead of failing each request later;
        it recovers when its steps fit again. (Ensembles loading right now check on their own.)"""
        for user in self._users_of(name):
            if user not in _LOAD_CHAIN.get():
                await self._rebuild(self.entries[user], f"after '{name}' was reloaded")

    async def _rebuild(self, entry: ModelEntry, why: str) -> None:
        async with entry.lock:
            old = dict(entry.versions)
            new = {v: ModelVersion(mv.ctx, mv.spec, mv.stats, mv.fingerprint, self._adapter_sources(mv.ctx))
                   for v, mv in old.items()}
            timeout = self.settings.model_load_timeout_secs or None
            results = await asyncio.gather(*(mv.load(timeout) for mv in new.values()), return_exceptions=True)
            errors = [r for r in results if isinstance(r, BaseException)]
            if errors:
                for mv in new.values():
                    await mv.unload(0)
                reason = errors[0].message if isinstance(errors[0], ModelplexError) else str(errors[0])
                entry.error = f"{reason} ({why})"
                for mv in old.values():
                    mv.fail(entry.error)
                log.error("model %s is unavailable %s: %s", entry.name, why, reason)
                return
            entry.versions, entry.error = new, ""
            for mv in old.values():
                await self._retire(mv)
            await self._rebuild_users(entry.name)  # models using this one in turn

    def _users_of(self, name: str) -> list[str]:
        """Loaded models that depend on `name`."""
        return sorted(e.name for e in list(self.entries.values())
                      if e.name != name and name in self._dependencies_of(e.name))

    @staticmethod
    def _check_name(config, location: ModelLocation) -> None:
        if config.name and config.name != location.name:
            raise InvalidInput(f"config.pbtxt names model '{config.name}' but its folder is '{location.name}'")
        config.name = location.name

    def _complete(self, config, location: ModelLocation) -> BackendSpec:
        """Fill the config as Triton does without --strict-model-config; returns the backend for it."""
        spec = self._backend_for(config, location)
        mc.check_model_filename(config)  # before auto-complete opens the file it names
        if not config.backend:
            config.backend = spec.name
        if not config.platform and spec.platforms:
            config.platform = spec.platforms[0]
        if not config.default_model_filename:
            config.default_model_filename = spec.default_model_filename
        if not config.HasField("version_policy"):
            config.version_policy.latest.num_versions = 1
        if not config.instance_group:
            config.instance_group.add(count=1)
        for i, group in enumerate(config.instance_group):
            group.name = group.name or f"{config.name}_{i}"
            group.count = group.count or 1
        if spec.auto_complete_config is not None and not self.settings.strict_model_config:
            versions = location.versions()
            if versions:
                spec.auto_complete_config(self._context(config.name, versions[-1], location, config))
        mc.validate(config)
        return spec

    def _backend_for(self, config, location: ModelLocation) -> BackendSpec:
        if config.backend:
            spec = self.backends.get(config.backend)
            if spec is None:
                raise InvalidInput(f"model '{config.name}': unknown backend '{config.backend}' "
                                   f"(installed: {', '.join(sorted(self.backends)) or 'none'})")
            return spec
        if config.platform:
            for spec in self.backends.values():
                if config.platform in spec.platforms:
                    return spec
            raise InvalidInput(f"model '{config.name}': no installed backend serves platform '{config.platform}'")
        for spec in dict.fromkeys(self.backends.values()):
            if spec.default_model_filename and any(
                    (location.path / str(v) / spec.default_model_filename).exists() for v in location.versions()):
                return spec
        raise InvalidInput(f"model '{config.name}': config.pbtxt names no backend or platform and no model file "
                           "of a known backend was found")

    def _context(self, name: str, version: int, location: ModelLocation, config) -> ModelContext:
        return ModelContext(name=name, version=version, model_path=location.path,
                            version_path=location.path / str(version), config=config,
                            parameters=self._backend_defaults(config) | mc.parameters_of(config),
                            dataplane=self.dataplane)

    def _backend_defaults(self, config) -> dict[str, str]:
        """--backend-config settings of the model's backend (named by its name or an alias); the
        model's own `parameters` override them."""
        spec = self.backends.get(config.backend)
        defaults: dict[str, str] = {}
        for backend, settings in self.settings.backend_config.items():
            if spec is not None and self.backends.get(backend) is spec:
                defaults |= settings
        return defaults

    def _new_version(self, name, version, location, config, spec, fingerprint) -> ModelVersion:
        ctx = self._context(name, version, location, config)
        stats = ModelStats(name, str(version))
        return ModelVersion(ctx, spec, stats, fingerprint, self._adapter_sources(ctx))

    # ---- LoRA adapters: names unique across models, dynamic ones kept over a reload ------------
    def _adapter_sources(self, ctx: ModelContext) -> list[AdapterSource]:
        """Static adapters of a new version, then the dynamic ones its ready predecessor serves."""
        sources = static_sources(ctx, self.settings.lora_adapter_roots)
        for source in sources:
            self.check_adapter_name(source.name, ctx.name)
        names = {s.name for s in sources}
        entry = self.entries.get(ctx.name)
        ready = [mv for mv in entry.versions.values() if mv.is_ready] if entry else []
        if ready:
            current = max(ready, key=lambda mv: mv.version)
            sources += [s for s in current.adapters.sources.values() if s.origin == "dynamic" and s.name not in names]
        return sources

    def check_adapter_name(self, adapter: str, model: str) -> None:
        """An adapter's name must not be a model's, nor another model's adapter (the OpenAI `model`
        field names either)."""
        if adapter in self.entries or adapter in self._known():
            raise InvalidInput(f"adapter name '{adapter}' is the name of a model")
        owner = self.find_adapter(adapter)
        if owner is not None and owner.name != model:
            raise InvalidInput(f"adapter '{adapter}' is already served by model '{owner.name}' (adapter names are "
                               "unique across models)")

    def find_adapter(self, adapter: str) -> ModelVersion | None:
        """The ready model version serving adapter `adapter`, if any."""
        for entry in list(self.entries.values()):
            for mv in list(entry.versions.values()):
                if mv.is_ready and adapter in mv.adapters.sources:
                    return mv
        return None

    async def _retire(self, mv: ModelVersion) -> None:
        await mv.unload(self.settings.unload_timeout_secs)
        release_freed_memory_soon()

    async def unload(self, name: str, unload_dependents: bool = False) -> None:
        """Unload `name`. A model that loaded models use (an ensemble's step) is refused unless
        `unload_dependents`, which unloads those users first and then the models `name` depends on
        that nothing else loaded uses (Triton's meaning of the flag for ensembles)."""
        check_name(name)
        users = self._users_of(name)
        if users and not unload_dependents:
            raise InvalidInput(f"model '{name}' is used by loaded model(s) {', '.join(users)}: unload "
                               "them first, or unload with unload_dependents")
        dependencies = self._dependencies_of(name) if unload_dependents else set()
        await self._unload_with_users(name)
        for dependency in sorted(dependencies):
            if not self._users_of(dependency):
                await self._unload_with_users(dependency)

    async def _unload_with_users(self, name: str) -> None:
        for user in self._users_of(name):
            await self._unload_with_users(user)
        await self._unload_entry(name)

    async def _unload_entry(self, name: str) -> None:
        entry = self.entries.get(name)
        if entry is None:
            if name not in self._known():
                raise NotFound(f"model '{name}' is not found")
            return
        async with entry.lock:
            versions, entry.versions = list(entry.versions.values()), {}
            await asyncio.gather(*(self._retire(mv) for mv in versions))
            entry.failed = {mv.version: "unloaded" for mv in versions}
            entry.error = ""
            if entry.override_dir is not None:
                shutil.rmtree(entry.override_dir, ignore_errors=True)
                entry.override_dir = None

    # ---- poll mode ----------------------------------------------------------------------
    async def _poll_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.repository_poll_secs)
            try:
                await self.poll_once()
            except Exception:
                log.exception("repository poll failed")

    async def poll_once(self) -> None:
        found = await asyncio.to_thread(lambda: {name: location.fingerprint()
                                                 for name, location in self.repository.scan().items()})
        for name, fingerprint in found.items():
            entry = self.entries.get(name)
            # A model whose load failed is tried again (and its error logged again) only once its files change.
            if entry is None or (entry.override_dir is None and entry.polled_fingerprint != fingerprint):
                await self._load_logged(name)
                if name in self.entries:  # also when the load failed before reading the folder
                    self.entries[name].polled_fingerprint = fingerprint
        for name in list(self.entries):
            if name not in found and self.entries[name].versions and self.entries[name].override_dir is None:
                await self._unload_with_users(name)  # gone from disk: models using it go too
