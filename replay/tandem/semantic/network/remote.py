"""The network an analysis guest talks to, played from the recording: the remote TCP
peer of every recorded connection (peer.py), the recorded answers to the guest's own
UDP requests (exchanges.py), and the guest's own connections matched to the recorded
ones (connections.py). What it sends the guest gathers in `outbox` until the loop's
next stop; what cannot be replayed goes to the run's limits, once each.
"""
from __future__ import annotations

from collections.abc import Iterable

from ...errors import TandemError
from ...formats import netpkt
from ..inputs import Flow, Input, InputKind, RecordedInputs
from ..model import NetOutput
from .connections import Connections
from .exchanges import Answers, Exchange
from .peer import Peer


class Remote:
    def __init__(self, rec: RecordedInputs, limits: list[str]):
        """limits: the run's (AnalysisRun.limits)."""
        self.rec, self.limits = rec, limits
        self.peer = Peer(router_advert=lambda: rec.router_advert)
        self.outbox: list[bytes] = []   # frames for the guest, sent at the next stop
        self.answers = Answers()        # the guest's UDP requests, answered from the recording
        self.unanswered: list[netpkt.Frame] = []    # live: requests the native's log may answer later
        # TCP connections the guest opens, matched to the recording's; SYNs not answered
        # yet, by 4-tuple (live: the native's log may bring their match); recorded
        # guest-opened connections given up on (never opened here).
        self.connections = Connections()
        self.connecting: dict[tuple[bytes, int, bytes, int], netpkt.Frame] = {}
        self.given_up: set[int] = set()
        # Connections forgotten here (forget) whose recording keeps them yet (live: retired
        # once every analysis is done, trail.Trail.trim): nothing more comes on them.
        self.forgotten: set[int] = set()

    @property
    def out(self) -> NetOutput:
        """What the guest sent, as the run keeps it (AnalysisRun.net)."""
        return self.peer.out

    def take(self, exchanges: Iterable[Exchange], flows: Iterable[Flow | None]) -> None:
        """The recording's new UDP exchanges and connections."""
        for ex in exchanges:
            self.answers.add(ex)
        for fl in flows:
            if fl is not None and fl.guest_opened:
                self.connections.add(fl)

    def release(self, inp: Input, now: int) -> list[bytes]:
        """The frames that deliver a network input at VM time `now`: a raw frame, or the
        TCP peer's segments."""
        peer = self.peer
        if inp.kind == InputKind.FRAME:
            f = netpkt.parse(inp.data)
            if f is not None and f.proto == netpkt.PROTO_UDP:      # the guest's answers to it are no requests
                peer.served.add((f.dport, f.ip_src, f.sport))
            return [inp.data]
        if inp.flow is None:
            raise TandemError(f"{inp.describe()}: a {inp.kind} input without its connection")
        if inp.kind == InputKind.TCP_OPEN:
            return self._open(inp, self.rec.flows[inp.flow], now)
        if inp.flow not in peer.flows:
            return []
        if inp.kind == InputKind.TCP_DATA:
            return peer.send(inp.flow, inp.data, now)
        if inp.kind == InputKind.TCP_FIN:
            return peer.close(inp.flow, now)
        if inp.kind == InputKind.TCP_RST:
            return peer.reset(inp.flow, now)
        return []

    def _open(self, inp: Input, fl: Flow | None, now: int) -> list[bytes]:
        if fl is None:      # retired once every analysis compared it: long after its opening
            raise TandemError(f"{inp.describe()}: opens a connection already retired")
        if fl.answer != "accepted":
            # The native refused it (opened here, it could be accepted), or never answered its
            # SYN (the guest had no address yet, or its SYN was lost, and the client gave up:
            # opened here, a guest booted a little earlier would serve it: an index page of
            # extra output on a connection the native never had).
            self.peer.not_opening(fl.index)
            return []
        return self.peer.open(fl.index, fl.client, fl.server, fl.client_mac, fl.guest_mac, now)

    def on_frame(self, frame: bytes, now: int) -> None:
        """A frame the guest sent: the peer's answer, and the guest's requests and new
        connections answered from the recording."""
        peer = self.peer
        self.outbox += peer.on_frame(frame, now)
        if peer.requests:
            self.unanswered += peer.requests
            peer.requests.clear()
            self.answer(now)
        if peer.connects or peer.ready:
            self.connect(now)

    def at_stop(self, now: int) -> list[bytes]:
        """At a stop: requests and connections a live native's log may have answered since,
        then the frames to send (the outbox, the peer's retransmissions)."""
        if self.unanswered:
            self.answer(now)
        if self.connecting:
            self.connect(now)
        frames, self.outbox = self.outbox + self.peer.retransmit(now), []
        return frames

    def answer(self, now: int) -> None:
        """Answer the guest's UDP requests from the recording (exchanges.py); one it holds
        no answer to is reported once, unless a live native's log may bring it yet."""
        left = []
        for f in self.unanswered:
            replies = self.answers.on_request(f, now)
            if replies is not None:
                self.outbox += [frame for _, frame in replies]
            elif not self.rec.finished:
                left.append(f)
            elif (line := self.answers.miss(f)) is not None:
                self.limits.append(line)
        self.unanswered = left

    def connect(self, now: int) -> None:
        """Answer the guest's new TCP connections as the recorded server did, each matched
        to a recorded connection (connections.py): by its SYN, or once its first bytes
        have come when the SYN leaves it ambiguous. One that matches none is reset and
        reported once, unless a live native's log may bring its match yet."""
        for syn in self.peer.connects:
            self.connecting[syn.flow()] = syn       # a retransmitted SYN: once
        self.peer.connects.clear()
        for key, syn in list(self.connecting.items()):
            group = self.connections.at_syn((syn.ip_dst, syn.dport))
            if not self.rec.finished and (not group or group[0].answer is None):
                continue                            # the native's log may say yet
            del self.connecting[key]
            self._answer_syn(syn, group, now)
        for pf in self.peer.ready:
            fl = self.connections.pick(pf.client, self.peer.first_bytes(pf))
            if fl is None:                          # its matches were all taken meanwhile
                self._miss(pf.server, pf.client)
                self.outbox += self.peer.reset_unbound(pf)
            else:
                self.connections.take(fl)
                self.peer.bind(pf, fl.index)
        self.peer.ready.clear()

    def _answer_syn(self, syn: netpkt.Frame, group: list[Flow], now: int) -> None:
        """Answer a SYN the recorded connections `group` may be (connections.at_syn)."""
        if not group:
            self._miss((syn.ip_src, syn.sport), (syn.ip_dst, syn.dport))
            self.outbox += self.peer.answer_syn(None, syn, now, "refused")
        elif len(group) == 1:
            self.connections.take(group[0])
            self.outbox += self.peer.answer_syn(group[0].index, syn, now, group[0].answer)
        else:
            self.outbox += self.peer.answer_syn(None, syn, now, "accepted")

    def _miss(self, guest: tuple[bytes, int], dst: tuple[bytes, int]) -> None:
        if (line := self.connections.miss(guest, dst)) is not None:
            self.limits.append(line)

    def give_up(self, fl: Flow) -> None:
        """A recorded connection the guest never opened here: not waited for again, nor
        matched to a connection it opens later."""
        self.given_up.add(fl.index)
        self.connections.take(fl)

    def forget(self, indices: Iterable[int]) -> None:
        """Connections done with (compared to their end, or never opened here). Those the
        recording has retired meanwhile leave `forgotten` (a long run's would fill it)."""
        indices = list(indices)
        if not indices:
            return
        flows = self.rec.flows
        self.forgotten = {i for i in self.forgotten if flows[i] is not None}
        for index in indices:
            self.peer.forget(index)
            self.forgotten.add(index)
