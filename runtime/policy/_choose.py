"""The machine-derived policy: (profile, calibration, geometry, settings) -> Tuning (pure).

Values are chosen in dependency order, each from the final (possibly
user-set) values before it: context and resident sequences, chunk size, RAM
pool, watermarks, disk budget, zstd level, swap-in threshold, prewarm count.
A tunable the user set wins, says "set by the user", and feeds what follows,
so nothing derived ever exceeds what the user allows.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..settings import Settings
from ._rates import choose_zstd_level, estimate_rates, rates_from
from ._types import ModelGeometry, Rates, Tuning

if TYPE_CHECKING:
    from ..hardware import Calibration, HardwareProfile

MiB = 1 << 20
GiB = 1 << 30
MAX_CTX = 32768  # longer contexts cost attention time on every token; users can ask for more
MAX_RESIDENT = 8  # beyond this, the RAM pool serves returning chats just as well
MIN_WANTED_CTX = 2048  # halve the context down to this to keep CHATS chats resident
CHATS = 4  # chats the context keeps room for, halving the context down to MIN_WANTED_CTX
HOST_KV_SHARE = 0.5  # of free host RAM, for the host part of a partly offloaded context
# A context in host RAM (CPU inference, or Metal's unified memory): every cell is
# allocated and cleared at start (1.7 GB and 2.5 s for 8 x 8192 cells of the default
# model on the development machine), and the RAM pool restores a chat that is not live
# in milliseconds. So the live KV gets CPU_LIVE_KV_BYTES, or for a larger model room
# for two chats of a useful length (an 8B model's two 8K chats take 2 GiB), no more.
CPU_LIVE_KV_BYTES = 512 * MiB  # the live context on a CPU for a small model
CPU_CHATS = 2  # chats a larger model's host-RAM context keeps room for
CPU_WANTED_CTX = 8192  # tokens each of those should get (or the model's trained length)
CPU_KV_SHARE = 0.6  # at most, of the host RAM left: the pool and some headroom get the rest
POOL_SHARE = 0.5  # of host RAM left after the OS, the model and the context
LOOKUP_MS = 0.2  # hashing the prompt's chunks and the index lookups a restore adds
CHUNK_COST_FACTOR = 4  # a chunk's transfer lasts 4x the fixed cost: overhead <= 20%
REDO_BUDGET_S = 0.25  # prefill of half a chunk, redone when a prompt diverges inside it
MIN_BATCH = 64  # tokens: smaller prefill batches cost a CPU 2-3x more a token (measured)
MAX_PREWARM = 16  # recent chats worth warming; older ones come back from disk on demand
PREWARM_SECONDS = 10.0  # prewarm runs in the background; this bounds its disk reads


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


@dataclass
class _Picks:
    """Collects values and reasons; a user setting always wins."""

    settings: Settings
    values: dict[str, Any] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)

    def pick(self, name: str, compute: Callable[[], tuple[Any, str]]) -> Any:
        override = getattr(self.settings, name)
        if override is not None:
            value, reason = override, "set by the user"
        else:
            value, reason = compute()
        self.values[name], self.reasons[name] = value, reason
        return value


@dataclass(frozen=True)
class _Memory:
    """Where the KV lives and how much room each side has, in bytes."""

    gpu_share: float  # fraction of the layers (weights and KV) in discrete GPU memory
    vram_for_kv: int
    host_free: int  # host RAM left after the OS reserve and the host part of the model
    unified: bool = False  # Apple silicon: the GPU works in host RAM (gpu_share stays 0)


def host_reserve(total: int) -> int:
    """RAM left to the OS, the desktop and warmstart's own process."""
    return max(2 * GiB, total // 8)


def vram_reserve(total: int) -> int:
    """VRAM for the CUDA context and llama.cpp's compute buffers."""
    return max(768 * MiB, total // 16)


def _gpu_share(profile: HardwareProfile, geometry: ModelGeometry, settings: Settings) -> float:
    if not profile.offloads or settings.n_gpu_layers == 0:
        return 0.0
    if settings.n_gpu_layers < 0 or settings.n_gpu_layers >= geometry.n_layer:
        return 1.0
    return settings.n_gpu_layers / max(geometry.n_layer, 1)


def _memory(profile: HardwareProfile, geometry: ModelGeometry, settings: Settings) -> _Memory:
    share = _gpu_share(profile, geometry, settings)
    vram_kv = 0
    if share > 0 and profile.gpu is not None:
        gpu = profile.gpu
        vram_kv = gpu.vram_free - int(share * geometry.model_bytes) - vram_reserve(gpu.vram_total)
    mem = profile.memory
    model_host = int((1 - share) * geometry.model_bytes)
    host_free = mem.available - host_reserve(mem.total) - model_host
    return _Memory(share, max(vram_kv, 0), max(host_free, 0), profile.unified_memory)


def _kv_capacity(mem: _Memory, kvb: int, n_ctx_train: int) -> tuple[int, str, int]:
    """Tokens of KV the live context can hold, which memory limits it, and how many
    chats the context should leave room for."""
    if mem.gpu_share == 0:
        budget, why, chats = _host_live_kv(mem, kvb, n_ctx_train)
        return int(budget / kvb), why, chats
    limits = []
    tokens = int(mem.vram_for_kv / (mem.gpu_share * kvb))
    limits.append((tokens, f"{_gib(mem.vram_for_kv)} of VRAM after the model"))
    if mem.gpu_share < 1:
        host = HOST_KV_SHARE * mem.host_free
        tokens = int(host / ((1 - mem.gpu_share) * kvb))
        limits.append((tokens, f"{_gib(host)} of host RAM after the OS and the model"))
    return (*min(limits), CHATS)


def _host_live_kv(mem: _Memory, kvb: int, n_ctx_train: int) -> tuple[int, str, int]:
    """Bytes of live KV for a context in host RAM, why, and the chats it keeps room
    for: CPU_LIVE_KV_BYTES (four chats, as on a GPU), or for a model whose two chats
    of CPU_WANTED_CTX tokens need more, that much (two chats); never more than
    CPU_KV_SHARE of the RAM left after the OS and the model, so that the RAM pool and
    some headroom fit beside it."""
    where = "unified memory (Metal)" if mem.unified else "CPU inference"
    chat = min(CPU_WANTED_CTX, n_ctx_train)
    wanted = CPU_CHATS * chat * kvb
    if wanted <= CPU_LIVE_KV_BYTES:
        budget, chats = CPU_LIVE_KV_BYTES, CHATS
        why = (
            f"live KV {_gib(budget)}, the least it gets ({CPU_CHATS} chats of {chat} tokens "
            f"of this model need {_gib(wanted)})"
        )
    else:
        budget, chats = wanted, CPU_CHATS
        why = f"live KV {_gib(budget)}: room for {CPU_CHATS} chats of {chat} tokens of this model"
    room = int(CPU_KV_SHARE * mem.host_free)
    if budget > room:
        budget = room
        why = (
            f"live KV {_gib(budget)}: {CPU_KV_SHARE:.0%} of the {_gib(mem.host_free)} of host "
            f"RAM left after the OS and the model, too little for {chats} chats of {chat} tokens"
        )
    return budget, f"{where}: {why}; the RAM pool restores other chats in milliseconds", chats


def _round_ctx(tokens: float) -> int:
    return max(256, int(tokens) // 256 * 256)


def _fit_ctx(capacity: int, resident: int | None, longest: int, chats: int) -> int:
    """The longest context (multiple of 256) that fits ``resident`` chats (each has a
    KV stream of its own), else room for ``chats``, halving down to MIN_WANTED_CTX."""
    if resident is not None:
        return min(longest, _round_ctx(capacity / resident))
    n_ctx = longest
    while n_ctx > MIN_WANTED_CTX and capacity < chats * n_ctx:
        n_ctx //= 2
    return min(n_ctx, _round_ctx(capacity / 2))


def _choose_context(
    p: _Picks, capacity: int, limit: str, geometry: ModelGeometry, chats: int
) -> None:
    longest = min(geometry.n_ctx_train, MAX_CTX)
    user_resident = p.settings.resident_sequences
    why = (
        f"longest context (<= {longest}, the model's {geometry.n_ctx_train} capped) "
        f"that leaves room for {chats} chats in {capacity} KV tokens ({limit})"
    )
    if capacity < 512:  # not even two of the smallest contexts: say so, loudly
        why = f"the smallest context: {limit} leaves room for only {capacity} KV tokens"
    n_ctx = p.pick("n_ctx", lambda: (_fit_ctx(capacity, user_resident, longest, chats), why))

    def resident() -> tuple[int, str]:
        fits = capacity // n_ctx
        value = min(MAX_RESIDENT, max(1, fits))
        why = f"{capacity} KV tokens hold {max(fits, 0)} chats of {n_ctx}"
        return value, why + (f"; capped at {MAX_RESIDENT}" if fits > MAX_RESIDENT else "")

    p.pick("resident_sequences", resident)


def _chunk(rates: Rates, kvb: int, n_ctx: int, tile: int = 0) -> tuple[int, str]:
    fixed_ms = rates.fixed_ms.get("ram", 0.0) + LOOKUP_MS
    gbps = rates.tier_gbps.get("ram", 1.0)
    wanted = CHUNK_COST_FACTOR * fixed_ms / 1000 * gbps * 1e9
    # Several MB a copy; smaller chunks would share prefixes more finely but pay
    # the fixed cost more often, larger ones would waste pool slots on short chats.
    target = min(max(wanted, 2 * MiB), 16 * MiB)
    tokens = 2 ** round(math.log2(max(target / kvb, 1)))
    # A chunk is also a prefill batch, and a prompt that diverges inside one is
    # re-prefilled from its start: keep that (half a chunk on average) short; but
    # never under MIN_BATCH, below which batches cost a CPU far more a token.
    redo = 2 ** math.floor(math.log2(max(2 * REDO_BUDGET_S * rates.prefill_tps, MIN_BATCH)))
    # a chunk is a prefill batch: never under MIN_BATCH (large-KV models would get a
    # few MiB of 16-token batches), nor over a quarter of the context
    tokens = min(max(MIN_BATCH, min(tokens, redo, 1024)), max(n_ctx // 4, 16))
    tiled = ""
    if tile and tokens < 2 * tile <= n_ctx // 4:
        # so that every batch of a long message can hold a tile or more (batch_cuts)
        tokens, tiled = 2 * tile, f", at least twice the batch tile ({tile})"
    return tokens, (
        f"{tokens} tokens = {tokens * kvb / MiB:.1f} MiB a transfer (about "
        f"{target / MiB:.0f} MiB wanted so the {fixed_ms:.2f} ms fixed cost stays small), "
        f"and half a chunk, re-prefilled after a divergence, takes about "
        f"{tokens / 2 / max(rates.prefill_tps, 1e-6) * 1000:.0f} ms at "
        f"{rates.prefill_tps:.0f} tokens/s (batches of at least {MIN_BATCH}{tiled})"
    )


def _pool(p: _Picks, mem: _Memory, profile: HardwareProfile, kvb: int) -> tuple[int, str]:
    v = p.values
    host_kv = int(v["resident_sequences"] * v["n_ctx"] * kvb * (1 - mem.gpu_share))
    free = max(mem.host_free - host_kv, 0)
    pool = int(POOL_SHARE * free)
    why = f"half of {_gib(free)} host RAM left after the OS, the model and the context"
    if _pinned(profile):
        cap = profile.memory.total // 2
        if pool > cap:  # page-locked memory cannot be swapped or reclaimed by the kernel
            pool, why = cap, f"capped at half of RAM ({_gib(cap)}): the pool is pinned"
    elif profile.unified_memory:  # the GPU reads this RAM in place: nothing to pin or cross
        why += "; unified memory: plain RAM, no PCIe link"
    slot = v["chunk_tokens"] * kvb
    pool = pool // slot * slot
    return pool, f"{_gib(pool)}: {why}"


def _watermarks(p: _Picks, kvb: int) -> None:
    """High leaves room for one full prompt's capture; low makes each demotion a batch."""
    pool = p.values["ram_pool_bytes"]
    slots = pool // (p.values["chunk_tokens"] * kvb)
    burst = p.values["n_ctx"] * kvb / pool if pool else 1.0  # one full prompt captured at once
    auto_high = min(0.95, max(0.5, 1 - burst))
    gap = min(0.4, max(0.1, burst, 4 / slots if slots else 1.0))
    user_low = p.settings.low_watermark
    if user_low is not None:  # keep the pair ordered around the user's value
        auto_high = min(1.0, max(auto_high, user_low + 0.05))
    high = p.pick(
        "high_watermark",
        lambda: (
            round(auto_high, 3),
            f"{1 - auto_high:.0%} headroom for capture; one full prompt is {burst:.1%} of the pool",
        ),
    )
    p.pick(
        "low_watermark",
        lambda: (
            round(max(high - gap, 0.0), 3),
            f"each demotion frees {gap:.0%} of the pool ({slots} slots): batches, not trickles",
        ),
    )


def _pinned(profile: HardwareProfile) -> bool:
    """Whether the RAM pool will be page-locked (CUDA offload; see kvstore/_pool.py)."""
    return profile.offloads and profile.backend == "cuda"


def _floor(p: _Picks, profile: HardwareProfile) -> tuple[int, str]:
    """The available memory the pool defends for everything else on the machine."""
    total = profile.memory.total
    floor = host_reserve(total) // MiB * MiB
    why = (
        f"the RAM kept for the OS and the desktop (the larger of 2 GiB and 1/8 of "
        f"{_gib(total)}): below it the pool moves its coldest chunks to disk and gives "
        f"their pages back, and grows again when memory returns"
    )
    if _pinned(profile) and p.values["ram_pool_bytes"]:
        why += (
            "; this pool is pinned (page-locked for DMA), and pinned pages can be neither "
            "swapped nor given back, so it is sized to leave this floor free when full "
            "(half of what the OS, the model and the context leave, at most half of RAM)"
        )
    return floor, why


def _disk_budget(profile: HardwareProfile) -> tuple[int, str]:
    disk = profile.disk
    budget = min(disk.free // 2, disk.total // 4) // MiB * MiB
    if budget < 256 * MiB:
        return 0, f"only {_gib(disk.free)} free on the cache disk: no disk tier"
    return budget, f"half the free space ({_gib(disk.free)}), at most a quarter of the disk"


def break_even_tokens(rates: Rates, kv_bytes_per_token: int) -> float:
    """Cached tokens at which restoring from RAM costs as much as recomputing them.

    Restore: fixed cost (one set_data call, lookups) plus bytes over the RAM
    tier's rate; recompute: tokens over the prefill rate. The prefill's own
    fixed cost is paid either way (the rest of the prompt is prefilled after a
    restore), so it cancels out. ``inf`` when restoring never pays.
    """
    fixed_ms = rates.fixed_ms.get("ram", 0.0) + LOOKUP_MS
    recompute_ms = 1000 / max(rates.prefill_tps, 1e-6)
    restore_ms = 1000 * kv_bytes_per_token / (max(rates.tier_gbps.get("ram", 0.0), 1e-9) * 1e9)
    if restore_ms >= recompute_ms:
        return math.inf
    return fixed_ms / (recompute_ms - restore_ms)


def _threshold(rates: Rates, kvb: int, n_ctx: int) -> tuple[int, str]:
    tokens = break_even_tokens(rates, kvb)
    if math.isinf(tokens):
        return n_ctx, "restoring a token is no faster than recomputing it here"
    return min(max(1, math.ceil(tokens)), n_ctx), (
        f"break-even of restore from RAM and recompute, fixed costs counted: {tokens:.1f} "
        f"tokens ({1000 / rates.prefill_tps:.2f} ms a token to recompute)"
    )


def _prewarm(p: _Picks, rates: Rates, kvb: int) -> tuple[int, str]:
    v = p.values
    if not v["ram_pool_bytes"] or not v["disk_budget_bytes"]:
        return 0, "no RAM pool or no disk tier to warm from"
    chat = min(v["n_ctx"], 2048) * kvb  # a typical chat, not a full context
    by_pool = int(v["ram_pool_bytes"] / 2 // chat)  # leave half the pool for new work
    by_time = int(PREWARM_SECONDS * rates.tier_gbps.get("disk", 0.0) * 1e9 // chat)
    count = max(0, min(by_pool, by_time, MAX_PREWARM))
    return count, f"min(half the pool: {by_pool}, {PREWARM_SECONDS:.0f} s of disk reads: {by_time})"


def _merge(calibration: Calibration | None, chunk: int) -> tuple[int, str]:
    if calibration is None or not calibration.merge_units:
        why = (
            "not measured"
            if calibration is None
            else ("this machine's kernels give a token other KV bits in a larger batch")
        )
        return 0, f"{why}: every prefill batch is one chunk"
    units, most = calibration.merge_units, calibration.merge_max
    if chunk not in units:
        sizes = ", ".join(str(u) for u in units)
        return 0, f"chunks of {chunk} tokens: merging was verified for {sizes}-token chunks only"
    return most, (
        f"measured: a {most}-token batch gives each token the KV bits of {chunk}-token "
        f"batches here, so whole chunks are prefilled {most // chunk} at a time"
    )


def _tile(calibration: Calibration | None) -> tuple[int, str]:
    if calibration is None or not calibration.batch_tile:
        why = "not measured" if calibration is None else "not so with this machine's kernels"
        return 0, f"{why}: batches are merged only as whole aligned chunks"
    tile = calibration.batch_tile
    return tile, (
        f"measured: a token's KV bits depend only on whether its batch holds at least "
        f"{tile} tokens, so batches of one kind are prefilled together (a message's "
        f"short batches in one decode), and a long message in batches that long"
    )


def _decode_batch(
    profile: HardwareProfile, calibration: Calibration | None, proven_by: int
) -> tuple[int, str]:
    if profile.offloads:  # CUDA's kernels are other ones: docs/batched-decode.md
        return 1, (
            "layers run on a GPU, where batched decode is not proven exact (the GPU "
            "check's probe says whether it is): replies are decoded one at a time"
        )
    if calibration is None:
        return 1, "not measured: replies are decoded one at a time"
    if proven_by < 2 and not calibration.decode_batch_note:  # an engine without the probe
        return 1, "replies are decoded one at a time: no batch of them was proven exact"
    if proven_by < 2:
        return 1, (
            f"replies are decoded one at a time: decoded together, they differ from each "
            f"decoded alone on this machine ({calibration.decode_batch_note})"
        )
    return proven_by, (
        f"measured: up to {proven_by} replies decoded in one step get every step's logits "
        f"and KV bits each gets decoded alone, so concurrent replies share decode steps"
    )


def choose(
    profile: HardwareProfile,
    calibration: Calibration | None,
    geometry: ModelGeometry,
    settings: Settings,
) -> Tuning:
    """The runtime's thresholds for this machine and model, each with its reason.

    Without a calibration, rates are cautious estimates from the profile. Any
    tunable set in ``settings`` wins and bounds the values derived from it.
    """
    p = _Picks(settings)
    kvb = max(geometry.kv_bytes_per_token, 1)
    mem = _memory(profile, geometry, settings)
    capacity, limit, chats = _kv_capacity(mem, kvb, geometry.n_ctx_train)
    _choose_context(p, capacity, limit, geometry, chats)
    n_ctx = p.values["n_ctx"]
    if calibration is not None:
        p.pick("zstd_level", lambda: choose_zstd_level(calibration))
        rates, basis = rates_from(calibration, p.values["zstd_level"]), "measured"
    else:
        p.pick("zstd_level", lambda: (0, "not measured: store raw until calibrated"))
        estimate = estimate_rates(profile, geometry)
        rates, basis = estimate.rates, estimate.basis
    p.pick("batch_tile", lambda: _tile(calibration))
    proven_by = calibration.decode_batch if calibration is not None else 0
    p.pick("decode_batch", lambda: _decode_batch(profile, calibration, proven_by))
    if p.values["decode_batch"] > max(proven_by, 1):
        p.reasons["decode_batch"] += (
            f": more than the {max(proven_by, 1)} proven exact here, so concurrent replies "
            "may differ from --no-cache in their last bits"
        )
    p.pick("chunk_tokens", lambda: _chunk(rates, kvb, n_ctx, p.values["batch_tile"]))
    p.pick("ram_pool_bytes", lambda: _pool(p, mem, profile, kvb))
    _watermarks(p, kvb)
    p.pick("disk_budget_bytes", lambda: _disk_budget(profile))
    p.pick("swap_in_threshold_tokens", lambda: _threshold(rates, kvb, n_ctx))
    p.pick("prewarm_sessions", lambda: _prewarm(p, rates, kvb))
    p.pick("merge_batch_tokens", lambda: _merge(calibration, p.values["chunk_tokens"]))
    p.pick("memory_floor_bytes", lambda: _floor(p, profile))
    reasons = dict(p.reasons)
    for name in ("chunk_tokens", "swap_in_threshold_tokens", "prewarm_sessions"):
        if reasons[name] != "set by the user":  # the values that rest on the rates
            reasons[name] += f" [{basis}]"
    return Tuning(reasons=reasons, **p.values)
