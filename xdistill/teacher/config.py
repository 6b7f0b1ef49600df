"""Teacher configuration: which model, where it runs, what it returns and how it gets back.

One :class:`TeacherConfig` per teacher (several teachers may run at once, each with its own
placement). Loaded strictly from YAML through :func:`xdistill.config.load_config` like every other
config; each field is documented by the comment above it.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field
from typing import Literal

from xdistill.errors import ConfigError

OutputKind = Literal["logits", "topk", "projected", "support"]
Placement = Literal["inprocess", "subprocess", "ray", "served"]
ServedProtocol = Literal["vllm", "echo"]
TransportKind = Literal["auto", "inprocess", "shm", "cuda_ipc", "ray"]
DTypeName = Literal["auto", "float32", "bfloat16", "float16"]


@dataclass
class RayPlacement:
    """Resources and placement of a teacher that runs as a Ray actor."""

    # CPUs reserved for the actor
    num_cpus: float = 1.0
    # GPUs reserved for the actor (Ray sets CUDA_VISIBLE_DEVICES inside it)
    num_gpus: float = 0.0
    # pin the actor to this Ray node id (NodeAffinitySchedulingStrategy); null = anywhere
    node_id: str | None = None
    # extra custom Ray resources the actor needs, e.g. {"teacher_node": 1}
    resources: dict[str, float] = field(default_factory=dict)
    # the Ray cluster to join when this process has not initialised Ray itself: "auto" (one
    # started with `ray start` on this node), "ray://host:10001", or null = $RAY_ADDRESS, else
    # "auto" under torchrun (every rank joins one cluster) and a local Ray of its own for a
    # single process
    address: str | None = None


@dataclass
class ServedPlacement:
    """A teacher answered by an OpenAI-compatible completions server (placement = "served";
    xdistill.teacher.served). Only output "topk" at temperature 1: the server returns top-K
    log-probs, never logits."""

    # base URL of the server's OpenAI API, e.g. "http://127.0.0.1:8000/v1" (requests go to
    # <url>/completions and <url>/models)
    url: str = ""
    # model name sent with each request; "" = the first model the server lists at <url>/models
    model: str = ""
    # request form: "vllm" = vLLM's extension (prompt_logprobs: K, plus the top-K of the one
    # generated token for the last position); "echo" = the standard OpenAI form (echo: true,
    # logprobs: K, max_tokens: 1) that other servers speak too
    protocol: ServedProtocol = "vllm"
    # ask for token ids instead of token strings (vLLM's return_tokens_as_token_ids); false for
    # servers that reject the field: token strings are then mapped to ids through the tokenizer
    # of the teacher's `model` folder (an unmappable string is a TeacherError naming it)
    token_ids: bool = True
    # seconds one HTTP request may take (connect + answer) before it counts as failed
    timeout_s: float = 120.0
    # extra tries of a request after a connection error, a timeout or an HTTP 5xx (4xx answers
    # are never retried); waits 0.5 s, 1 s, 2 s, ... (at most 8 s) between tries
    retries: int = 3
    # rows of a batch in flight at once (one request per row)
    concurrency: int = 8
    # environment variable holding the API key (sent as "Authorization: Bearer <key>");
    # "" = no key. The key itself never goes into a config
    api_key_env: str = ""


@dataclass
class TeacherConfig:
    """One teacher model: where it runs, what it computes, how its output travels."""

    # teacher name (matches TeacherView.name)
    name: str = "teacher"
    # local folder of a Hugging Face causal LM (AutoModelForCausalLM.from_pretrained); for
    # placement "served", the local folder of the served model (its config.json gives the
    # vocabulary width, its tokenizer maps token strings); its weights are not loaded
    model: str = ""
    # weights (and compute) dtype. "auto" = bfloat16 where `device` has fast bf16 matrix units
    # (CUDA; CPUs whose torch reports AMX), else float32, whatever dtype the checkpoint was
    # saved in; the choice and its reason are logged once (xdistill.precision). (Before, "auto"
    # meant "keep the checkpoint's dtype": the real-model assets are saved in bfloat16, which
    # made their teachers bf16 even where that is slower.) An explicit dtype always wins
    dtype: DTypeName = "auto"
    # attention implementation passed to transformers ("sdpa", "eager", ...); "" = its default
    # (sdpa for the supported architectures; the real-pair benchmark measures both)
    attn_implementation: str = ""
    # torch device of the teacher inside its worker ("cpu", "cuda", "cuda:1"); "cuda" is the
    # training process's current GPU (each rank's own under torchrun) for in-process and
    # subprocess workers, the GPU Ray assigned for a Ray actor
    device: str = "cpu"
    # where the worker runs: in the training process, a spawned subprocess, a Ray actor, or
    # "served": an OpenAI-compatible completions server (see `served`; output "topk" only)
    placement: Placement = "inprocess"
    # what the teacher returns: full logits, top-k log-probs + tail mass, log-probs projected
    # into the student vocabulary through a sparse projection, or "support": the logits at the
    # projection's support columns only (the teacher tokens some student token maps to: all
    # that loss 'pkl' reads; the head computes only those columns and no token log-probs, so a
    # 262k-token teacher whose support is 46k columns spends ~1/5 of the head's time; pkl only)
    output: OutputKind = "logits"
    # number of top log-probs kept per position when output = "topk"
    top_k: int = 64
    # softmax temperature applied to the teacher logits (recorded in every output)
    temperature: float = 1.0
    # rows per teacher forward; the batch is split into micro-batches of this size
    micro_batch_size: int = 8
    # dtype of full-logits outputs; "auto" = float32: a bfloat16 teacher's head writes float32
    # logits from its bfloat16 hidden states, block by block (xdistill.teacher.head). bfloat16
    # halves the buffer (and the transport) at ~2^-9 relative rounding of every logit
    logits_dtype: DTypeName = "auto"
    # seconds to wait for one teacher forward before raising TeacherError
    timeout_s: float = 300.0
    # seconds to wait for the worker to start and load its model
    startup_timeout_s: float = 600.0
    # in-process teachers on a GPU: move the weights to CPU between forwards
    offload: bool = False
    # how outputs reach the student: "inprocess", "shm" (shared memory), "cuda_ipc" or "ray"
    # (the object store); "auto" picks CUDA IPC (same node, CUDA), shared memory (same node,
    # CPU) or the Ray object store (actor on another node)
    transport: TransportKind = "auto"
    # number of reusable output slots (ring) per teacher for the shm / CUDA IPC transports
    slots: int = 2
    # torch intra-op threads inside a subprocess / Ray worker (0 = torch's default); in-process
    # teachers share the training process's setting
    num_threads: int = 0
    # keep up to this many MB of this teacher's output rows in memory (in its worker) and copy
    # a row seen before instead of recomputing it: multi-epoch off-policy runs with
    # data.shuffle false see the same windows every epoch (first come, first kept, never
    # evicted; see xdistill.teacher.cache); 0 = off
    cache_mb: float = 0.0
    # pass trust_remote_code to from_pretrained (custom architectures)
    trust_remote_code: bool = False
    # Ray actor resources and placement (placement = "ray")
    ray: RayPlacement = field(default_factory=RayPlacement)
    # the server of a teacher with placement = "served"
    served: ServedPlacement = field(default_factory=ServedPlacement)

    def validate(self) -> "TeacherConfig":
        """Raise :class:`ConfigError` naming the first inconsistent field."""
        where = f"teacher {self.name!r}"
        if not 0 < self.temperature < math.inf:    # written so that NaN fails too
            raise ConfigError(f"{where}: temperature must be > 0 and finite, got "
                              f"{self.temperature}")
        if self.num_threads < 0:
            raise ConfigError(f"{where}: num_threads must be >= 0 (0 = torch's default), got "
                              f"{self.num_threads}")
        if self.micro_batch_size < 1:
            raise ConfigError(f"{where}: micro_batch_size must be >= 1, "
                              f"got {self.micro_batch_size}")
        if self.output == "topk" and self.top_k < 1:
            raise ConfigError(f"{where}: top_k must be >= 1 for output 'topk', got {self.top_k}")
        if not self.cache_mb >= 0:
            raise ConfigError(f"{where}: cache_mb must be >= 0 (0 = no cache), got {self.cache_mb}")
        if self.slots < 1:
            raise ConfigError(f"{where}: slots must be >= 1, got {self.slots}")
        if not (self.timeout_s > 0 and self.startup_timeout_s > 0):    # NaN too
            raise ConfigError(f"{where}: timeout_s and startup_timeout_s must be > 0 (got "
                              f"{self.timeout_s}, {self.startup_timeout_s})")
        if self.placement == "inprocess" and self.transport not in ("auto", "inprocess"):
            raise ConfigError(
                f"{where}: transport {self.transport!r} needs placement 'subprocess' or 'ray' "
                f"(an in-process teacher hands tensors over directly)")
        if self.placement not in ("inprocess", "served") and self.transport == "inprocess":
            raise ConfigError(f"{where}: transport 'inprocess' needs placement 'inprocess'")
        if self.transport == "ray" and self.placement != "ray":
            raise ConfigError(f"{where}: transport 'ray' needs placement 'ray'")
        if self.offload and self.placement != "inprocess":
            raise ConfigError(f"{where}: offload applies to in-process teachers only")
        if self.placement == "served":
            self._validate_served(where)
        return self

    def _validate_served(self, where: str) -> None:
        s = self.served
        if self.output != "topk":
            raise ConfigError(f"{where}: placement 'served' only serves output 'topk' (a "
                              f"completions server returns top-K log-probs), got {self.output!r}")
        if self.temperature != 1.0:
            raise ConfigError(f"{where}: placement 'served' needs temperature 1.0 (the server's "
                              f"top-K log-probs are at temperature 1), got {self.temperature}")
        if not s.url.startswith(("http://", "https://")):
            raise ConfigError(f"{where}: served.url must be an http(s) URL such as "
                              f"'http://127.0.0.1:8000/v1', got {s.url!r}")
        if not s.timeout_s > 0 or s.retries < 0 or s.concurrency < 1:    # NaN too
            raise ConfigError(f"{where}: served.timeout_s must be > 0, served.retries >= 0 and "
                              f"served.concurrency >= 1 (got {s.timeout_s}, {s.retries}, "
                              f"{s.concurrency})")
        if self.transport not in ("auto", "inprocess") or self.cache_mb:
            raise ConfigError(f"{where}: placement 'served' takes no transport or cache_mb (its "
                              "outputs arrive as JSON)")
