"""Virtual hosts on this machine: Linux network namespaces joined by veth pairs to a bridge.

Each `VirtualHost` is a namespace with its own address (10.77.N.i/24) and its own loopback;
one end of its veth pair sits in it, the other on a bridge in this (the root) namespace,
which has 10.77.N.254 and so reaches every host, as the hosts reach each other through the
bridge. A process started with `host.command(args)` runs inside the namespace: bound to its
address, the Conductor's gRPC, the agents' control and KV data plane cross real links.
`limit_rate` caps a host's link in both directions (`tc tbf`); `netem` adds delay and loss
(`tc netem`, where the kernel has it: `netem_missing_reason()`).

Needs root, `ip` and `tc` (iproute2); `missing_reason()` says why not, for tests to skip.
Everything is removed on exit, and leftovers of a killed run (same prefix) at the next start.
"""

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from types import TracebackType

PREFIX = "kvc"  # namespaces, links and the bridge are named kvc<tag>...


@dataclass(frozen=True, slots=True)
class VirtualHost:
    name: str  # the namespace
    address: str  # its IPv4 address on the bridge
    host_link: str  # the veth end on the bridge (root namespace)
    link: str  # the veth end inside the namespace

    def command(self, args: list[str]) -> list[str]:
        """`args` as a command run inside this host's namespace."""
        return ["ip", "netns", "exec", self.name, *args]


def missing_reason() -> str | None:
    """Why virtual hosts cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"`ip netns` does not work here: {probe.stderr.strip()}"
    return None


def netem_missing_reason() -> str | None:
    """Why `tc netem` (delay, loss) cannot be used here, or None: some kernels lack it."""
    reason = missing_reason()
    if reason is not None:
        return reason
    name = f"{PREFIX}probe{os.getpid() % 100000}"
    try:
        _run(["ip", "link", "add", name, "type", "veth", "peer", "name", f"{name}p"])
    except RuntimeError as error:
        return str(error)
    try:
        _run(["tc", "qdisc", "add", "dev", name, "root", "netem", "delay", "1ms"])
    except RuntimeError as error:
        return f"this kernel has no netem qdisc ({error})"
    finally:
        subprocess.run(["ip", "link", "del", name], capture_output=True, check=False)
    return None


@dataclass
class VirtualHosts:
    """`count` hosts on one bridge; a context manager. `tag` (a few letters or digits) keeps
    concurrent sets apart; `subnet` is the third octet of 10.77.N.0/24."""

    count: int
    tag: str = "0"
    subnet: int = 77
    hosts: list[VirtualHost] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.tag}br"

    @property
    def gateway(self) -> str:
        """The root namespace's address on the bridge: where clients on this machine stand."""
        return f"10.77.{self.subnet}.254"

    def __enter__(self) -> "VirtualHosts":
        reason = missing_reason()
        if reason is not None:
            raise RuntimeError(f"cannot make virtual hosts: {reason}")
        if not 1 <= self.count <= 250:
            raise ValueError(f"1 to 250 virtual hosts, not {self.count}")
        self._remove()  # leftovers of an earlier run that was killed
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for index in range(self.count):
                self.hosts.append(self._add_host(index))
        except BaseException:
            self._remove()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._remove()

    def _add_host(self, index: int) -> VirtualHost:
        host = VirtualHost(
            name=f"{PREFIX}{self.tag}-h{index}",
            address=f"10.77.{self.subnet}.{index + 1}",
            host_link=f"{PREFIX}{self.tag}v{index}",  # interface names: 15 characters at most
            link=f"{PREFIX}{self.tag}p{index}",
        )
        _ip("netns", "add", host.name)
        _ip("link", "add", host.host_link, "type", "veth", "peer", "name", host.link)
        _ip("link", "set", host.link, "netns", host.name)
        _ip("link", "set", host.host_link, "master", self.bridge)
        _ip("link", "set", host.host_link, "up")
        inside = ["ip", "netns", "exec", host.name, "ip"]
        _run([*inside, "addr", "add", f"{host.address}/24", "dev", host.link])
        _run([*inside, "link", "set", host.link, "up"])
        _run([*inside, "link", "set", "lo", "up"])
        return host

    def limit_rate(self, host: VirtualHost, rate_mbit: float) -> None:
        """Cap `host`'s link at `rate_mbit` each way (a token bucket, `tc tbf`)."""
        options = ["rate", f"{rate_mbit}mbit", "burst", "64kb", "latency", "500ms"]
        self._qdisc(host, "tbf", options)

    def drop_overflow(self, host: VirtualHost, rate_mbit: float, queue_ms: float) -> None:
        """A lossy link: `host`'s link carries `rate_mbit` each way and drops the packets that
        would wait longer than `queue_ms` (`tc tbf` with a short queue; without netem's
        random loss this is the loss a congested link shows, bursts cut off)."""
        options = ["rate", f"{rate_mbit}mbit", "burst", "16kb", "latency", f"{queue_ms}ms"]
        self._qdisc(host, "tbf", options)

    def dropped_packets(self, host: VirtualHost) -> int:
        """Packets the queueing disciplines of `host`'s link dropped, both ends."""
        show = ["tc", "-s", "-j", "qdisc", "show", "dev"]
        outputs = [
            _output([*show, host.host_link]),
            _output(host.command([*show, host.link])),
        ]
        return sum(int(q.get("drops", 0)) for text in outputs for q in json.loads(text or "[]"))

    def limit_rate_to(
        self,
        host: VirtualHost,
        destination: VirtualHost,
        rate_mbit: float,
        *,
        source_port: int | None = None,
    ) -> None:
        """Cap what `host` sends to `destination` at `rate_mbit`, or only what it sends from
        `source_port` (what a server there answers); its other traffic and the way back keep
        full speed (`tc htb` classes, a `u32` match on the destination and port). Shaping a
        server's answers alone keeps the acknowledgements of a transfer the other way out of
        the slow class: behind its full queue they held a transfer shaped at 80 Mbit/s to
        the 8 Mbit/s of the way back."""
        inside = ["tc", "qdisc", "replace", "dev", host.link, "root", "handle", "1:", "htb"]
        _run(host.command([*inside, "default", "20", "r2q", "1000"]))
        classes = (("1:10", f"{rate_mbit}mbit"), ("1:20", "40gbit"))
        for class_id, rate in classes:
            tc_class = ["tc", "class", "replace", "dev", host.link, "parent", "1:"]
            _run(host.command([*tc_class, "classid", class_id, "htb", "rate", rate]))
        match = ["match", "ip", "dst", f"{destination.address}/32"]
        if source_port is not None:
            match += ["match", "ip", "sport", str(source_port), "0xffff"]
        match += ["flowid", "1:10"]
        tc_filter = ["tc", "filter", "add", "dev", host.link, "parent", "1:", "protocol", "ip"]
        _run(host.command([*tc_filter, "u32", *match]))

    def netem(self, host: VirtualHost, *, delay_ms: float = 0.0, loss_percent: float = 0.0) -> None:
        """Delay and drop packets on `host`'s link, each way (`tc netem`)."""
        options = ["delay", f"{delay_ms}ms"]
        if loss_percent:
            options += ["loss", f"{loss_percent}%"]
        self._qdisc(host, "netem", options)

    def _qdisc(self, host: VirtualHost, kind: str, options: list[str]) -> None:
        _run(["tc", "qdisc", "replace", "dev", host.host_link, "root", kind, *options])
        _run(host.command(["tc", "qdisc", "replace", "dev", host.link, "root", kind, *options]))

    def _remove(self) -> None:
        names = subprocess.run(
            ["ip", "netns", "list"], capture_output=True, text=True, check=False
        ).stdout.split()
        for name in names:
            if name.startswith(f"{PREFIX}{self.tag}-h"):
                subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
        for index in range(max(self.count, 1)):  # a veth's root end, if its namespace is gone
            link = f"{PREFIX}{self.tag}v{index}"
            subprocess.run(["ip", "link", "del", link], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, check=False)
        self.hosts.clear()


def _ip(*args: str) -> None:
    _run(["ip", *args])


def _output(args: list[str]) -> str:
    result = subprocess.run(args, capture_output=True, text=True, check=False, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"`{' '.join(args)}` failed: {result.stderr.strip()}")
    return result.stdout


def _run(args: list[str]) -> None:
    _output(args)
