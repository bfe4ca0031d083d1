"""Data races between the programs of one Triton launch, found by construction.

The interpreter runs a launch's programs one after another, so a lost update (two programs reading
and writing a shared accumulator without atomics) never shows in the values: every order gives the
same sum. What does show is the addresses: :class:`AccessLog` records, per program, every address
it loads, stores or touches atomically (the masked lanes only, after the bounds check), and
:func:`find_races` flags every address that

* two programs overwrite (store, ``atomic_xchg``, ``atomic_store``), each leaving a different value
  last: the last one wins (a lost update written with exchanges is one; every program storing the
  same flag, or releasing a lock to the same value, is not), or
* one program writes (a store or an atomic) and another touches, with a plain load or store among
  the accesses next to an atomic or a load: atomics accumulating across programs are what atomics
  are for, a plain load of what another program writes reads it before or after.

A program reading what it wrote itself is not a race, nor is a later launch reading an earlier
one's output (one log per launch). Addresses are element start addresses: two accesses of
different widths that overlap without starting at the same byte are not matched (mixed-width views
of one buffer inside a kernel are rare). Synchronisation through atomics (a spin lock taken with
``atomic_cas`` around plain loads and stores, a "last program" counter) is not modelled: such
kernels are reported as racing.

Cost: the analysis sorts the written addresses and the loads of written addresses, once per launch
(numpy); after :data:`MAX_ADDRESSES` addresses loads are no longer recorded (writes are, up to twice
that), and the summary says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

STORE, ATOMIC, LOAD, EXCHANGE = 0, 1, 2, 3  # EXCHANGE: atomic_xchg, an atomic that overwrites

# Addresses recorded per launch at most (8 bytes each, plus the stores' bits): 128 MiB.
MAX_ADDRESSES = 1 << 24


@dataclass
class AccessLog:
    """The addresses one launch's programs touched, as numpy arrays per access."""

    kernel: str = "?"
    program: int = 0  # the running program's linear index in the grid
    programs: int = 0  # programs that ran
    addresses: list[Any] = field(default_factory=list)
    programs_of: list[int] = field(default_factory=list)
    kinds: list[int] = field(default_factory=list)
    bits: list[Any] = field(default_factory=list)  # stores, exchanges: the written bits (uint64); else None
    recorded: int = 0
    cut_short: bool = False
    limit: int | None = None  # addresses recorded at most; None: MAX_ADDRESSES

    def add(self, kind: int, addresses: Any, bits: Any = None) -> None:
        """Record ``addresses`` (1-D, the active lanes only) for the running program."""
        n = int(addresses.size)
        if n == 0:
            return
        limit = MAX_ADDRESSES if self.limit is None else self.limit
        if self.cut_short or self.recorded + n > limit:
            # over the budget, loads are dropped; writes (the end of a long loop stores) are still
            # recorded, up to twice the budget
            self.cut_short = True
            if kind == LOAD or self.recorded + n > 2 * limit:
                return
        self.recorded += n
        self.addresses.append(addresses)
        self.programs_of.append(self.program)
        self.kinds.append(kind)
        self.bits.append(bits)


@dataclass
class RaceReport:
    races: int  # addresses that race
    example: str  # one of them, described
    accesses: int  # addresses analysed


def find_races(log: AccessLog, ranges: list[tuple[int, int]] | None = None) -> RaceReport | None:
    """The addresses of ``log`` that race (None when none does). ``ranges``: the launch's argument
    storages, to describe an address as an offset into one."""
    import numpy as np

    def gather(which: list[int]) -> tuple[Any, Any, Any]:
        sizes = [log.addresses[i].size for i in which]
        addr = np.concatenate([log.addresses[i] for i in which])
        pid = np.repeat(np.array([log.programs_of[i] for i in which], dtype=np.int64), sizes)
        kind = np.repeat(np.array([log.kinds[i] for i in which], dtype=np.int8), sizes)
        return addr, pid, kind

    def bits_of(which: list[int]) -> Any:
        return np.concatenate([log.bits[i] if log.bits[i] is not None else np.zeros(log.addresses[i].size, np.uint64)
                               for i in which])

    written = [i for i, k in enumerate(log.kinds) if k != LOAD]
    if not written:
        return None
    addr, pid, kind = gather(written)
    overwritten_apart = _overwritten_apart([i for i in written if log.kinds[i] in (STORE, EXCHANGE)], gather, bits_of)
    loaded = [i for i, k in enumerate(log.kinds) if k == LOAD]
    if loaded:  # only loads of addresses someone writes can race
        l_addr, l_pid, l_kind = gather(loaded)
        keep = np.isin(l_addr, addr)
        if keep.any():
            addr = np.concatenate([addr, l_addr[keep]])
            pid = np.concatenate([pid, l_pid[keep]])
            kind = np.concatenate([kind, l_kind[keep]])
    order = np.lexsort((pid, addr))
    addr, pid, kind = addr[order], pid[order], kind[order]
    same = addr[1:] == addr[:-1]
    starts = np.flatnonzero(np.concatenate(([True], ~same)))
    # per address: touched by two programs or more; any plain access; any load; any atomic
    many = np.add.reduceat(np.concatenate(([False], same & (pid[1:] != pid[:-1]))), starts) > 0
    if not many.any():
        return None
    is_atomic = (kind == ATOMIC) | (kind == EXCHANGE)
    plain = np.add.reduceat(~is_atomic, starts) > 0
    loads = np.add.reduceat(kind == LOAD, starts) > 0
    atomics = np.add.reduceat(is_atomic, starts) > 0
    racing = many & ((plain & (atomics | loads)) | np.isin(addr[starts], overwritten_apart))
    if not racing.any():
        return None
    g = int(np.flatnonzero(racing)[0])
    lo = int(starts[g])
    hi = int(starts[g + 1]) if g + 1 < starts.size else addr.size
    return RaceReport(int(racing.sum()), _describe(addr[lo], pid[lo:hi], kind[lo:hi], ranges), int(addr.size))


def _overwritten_apart(which: list[int], gather: Any, bits_of: Any) -> Any:
    """Addresses that two programs overwrite, each leaving a different value last."""
    import numpy as np

    if not which:
        return np.zeros(0, dtype=np.uint64)
    addr, pid, _ = gather(which)
    bits = bits_of(which)
    order = np.lexsort((pid, addr))  # stable: a program's exchanges stay in program order
    addr, pid, bits = addr[order], pid[order], bits[order]
    last = np.concatenate(((addr[1:] != addr[:-1]) | (pid[1:] != pid[:-1]), [True]))
    addr, bits = addr[last], bits[last]  # each program's last write at each address
    apart = (addr[1:] == addr[:-1]) & (bits[1:] != bits[:-1])
    return np.unique(addr[1:][apart])


def _describe(address: Any, pids: Any, kinds: Any, ranges: list[tuple[int, int]] | None) -> str:
    """One racing address in words: who wrote it, who else touched it, where it lies."""

    a = int(address)
    where = hex(a)
    for j, (lo, hi) in enumerate(ranges or []):
        if lo <= a < hi:
            where = f"byte {a - lo} of argument storage {j}"
            break
    writer = int(pids[kinds != LOAD][0])
    others = pids[pids != writer]
    other = int(others[0])  # a racing address is touched by two programs at least

    def verbs(program: int) -> str:
        mine = set(kinds[pids == program].tolist())
        words = [w for k, w in ((LOAD, "loads"), (STORE, "stores"), (ATOMIC, "updates atomically"),
                                (EXCHANGE, "exchanges a value into")) if k in mine]
        return " and ".join(words)

    return f"{where}: program {writer} {verbs(writer)} it, program {other} {verbs(other)} it"
