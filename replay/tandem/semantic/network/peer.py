"""The remote side of the network, played for an analysis guest.

A different kernel picks its own sequence numbers, windows and segment sizes,
so the recorded client packets cannot be replayed as they are. The peer opens
each recorded connection itself (as COLO's filter-rewriter and tcpliveplay do,
it speaks with the analysis guest's own sequence numbers), carries the recorded
client payload, respects the guest's window and MSS, acknowledges what the
guest sends (again if the guest retransmits), retransmits its own data when
unacknowledged, and closes as the client did (FIN or RST). It answers ARP for
the network's addresses, and hands the guest's own UDP requests to remote.Remote, which
answers them from the recording (exchanges.py). Everything happens at VM times the
caller gives.

It plays the remote server of a connection the guest opens (a backend nginx proxies
to) too: remote.Remote matches the guest's SYN to a recorded connection (connections.py)
and the peer answers it as the recorded server did (answer_syn: SYN-ACK, RST, or
nothing); from there the server's bytes and its FIN or RST are sent like a client's.
A SYN that may be one of several recorded connections open at once is accepted
unbound, and bound to one once the guest's first bytes have come (ready, bind).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from enum import StrEnum

from ...formats import netpkt
from ...formats.netpkt import ACK, FIN, PSH, RST, SYN
from ..inputs import REQUEST_KEPT
from ..model import FlowOutput, NetOutput

UNKNOWN_KEPT = 100
PEER_WINDOW = 65535
PEER_MSS = 1460
RTO_NS = 200_000_000        # VM time before unacknowledged data is sent again
# An ACK of the guest's bytes waits this long for bytes to carry it, as Linux's does
# (TCP_DELACK_MIN): a client pipelining requests acknowledges a reply with its next
# request. Acknowledging every reply at once doubled the frames a heavy run's analysis
# took in (58,305 against the 29,208 the same clients sent a live KASAN guest), and
# its instructions by 21% (11.5 G against 9.5 G, bench/offline_heavy.py).
DELACK_NS = 40_000_000
SYN_RETRY_NS = 50_000_000   # a refused connection (service not listening yet) is retried
SYN_RETRY_FOR_NS = 60_000_000_000   # ... for this long, like a patient client
ACCEPT_ISN = 0x8000_0000    # the first initial sequence number of a connection the guest opens


class TcpState(StrEnum):
    """Where a connection the peer plays stands (PeerFlow.state)."""
    CLOSED = "closed"               # not opened yet
    SYN_SENT = "syn-sent"           # the peer opened it: its SYN is not answered yet
    REFUSED = "refused"             # the guest refused it (not listening yet): retried every SYN_RETRY_NS
    SYN_RECEIVED = "syn-received"   # the guest opened it: the peer's SYN-ACK is not acknowledged yet
    ESTABLISHED = "established"
    DONE = "done"                   # closed both ways, or reset either way
    SILENT = "silent"               # the guest opened it and the recorded server never answered: nor does the peer


@dataclass
class PeerFlow:
    index: int
    client: tuple[bytes, int]
    server: tuple[bytes, int]
    client_mac: bytes
    guest_mac: bytes
    isn: int
    # One the peer opened: CLOSED, SYN_SENT (or REFUSED, and SYN_SENT again), ESTABLISHED,
    # DONE; one the guest opened: SYN_RECEIVED, ESTABLISHED, DONE, or SILENT.
    state: TcpState = TcpState.CLOSED
    snd_una: int = 0            # offsets into our stream (0 = SYN)
    snd_nxt: int = 0
    sendbuf: bytearray = field(default_factory=bytearray)   # client bytes not acknowledged yet,
    sendbase: int = 1                                       # from this offset (1: after the SYN)
    fin_queued: bool = False
    fin_sent: bool = False
    rcv_nxt: int = 0            # guest's next sequence number
    guest_isn: int = 0
    guest_window: int = 0
    guest_mss: int = 536
    guest_bytes: int = 0        # payload received from the guest, in order
    # What the guest sent, in order, its FIN and a reset, as plain values the run keeps
    # (model.FlowOutput in AnalysisRun.net) for the comparators.
    out: FlowOutput = field(default_factory=FlowOutput)
    ack_owed_ns: int | None = None  # VM time of the first guest bytes not acknowledged yet
    unacked: int = 0                # guest bytes in order since the last ACK sent
    last_send_ns: int = 0
    opened_ns: int = 0
    refusals: int = 0
    syns_unanswered: int = 0    # SYNs sent again because the guest did not answer (no RST either)
    peer_opened: bool = False   # the recorded client's connection (open), not one the guest opened

    def seq(self, off: int) -> int:
        return (self.isn + off) & 0xFFFFFFFF

    @property
    def ipv4(self) -> bool:
        """An IPv4 connection (QEMU's release rules follow no other: qemu-patches/0034)."""
        return len(self.server[0]) == 4

    def guest_key(self) -> bytes:
        """The 4-tuple of the guest's segments on this connection, as on the wire
        (source and destination address, source and destination port)."""
        return struct.pack("!4s4sHH", self.server[0], self.client[0], self.server[1], self.client[1])

    def unsent(self) -> bool:
        """Bytes (or a FIN) wait for the guest's window."""
        return self.snd_nxt < self.sendbase + len(self.sendbuf) or (self.fin_queued and not self.fin_sent)

    def end(self) -> None:
        """Done with: closed both ways, or reset either way."""
        self.state = TcpState.DONE
        self.out.over = True


def _reset_while_starting(fl: PeerFlow, answered: set[tuple[bytes, int]]) -> bool:
    """A connection the peer opened, reset by the guest before it answered a byte, with
    all the client's bytes still at hand, while its service was starting: it was refused
    first, or its SYN went unanswered at first (the guest's network not up yet), or no
    connection to that address and port has had a byte of answer here yet (`answered`).
    Retried like a refused one: the native's service had answered it. The last case is a
    listening socket that took the connection and closed, as `nginx -t` does (Debian's
    nginx.service runs it first: it binds port 80 and exits): the reference VM under
    KASAN took two connections 10 ms apart, reset both 20 ms later, and answered the
    next one 400 ms after. An unanswered SYN counts as much as a refusal: a KASAN guest on a
    user's disk brings its network up some 14 s of VM time after the native's first
    request, so that SYN goes unanswered. Not retrying any of these reports the request
    "missing". The cost: a service that crashes on its first request gets it again
    until SYN_RETRY_FOR_NS has passed, and the finding is reported from its first crash."""
    return fl.peer_opened and fl.state == TcpState.ESTABLISHED and fl.guest_bytes == 0 and fl.sendbase == 1 \
        and (fl.refusals > 0 or fl.syns_unanswered > 0 or fl.server not in answered)


def _reset_applies(fl: PeerFlow, f: netpkt.Frame) -> bool:
    """Does the guest's reset apply to the connection as it stands (RFC 9293 3.10.7,
    RFC 5961 3.2)? Opening, one that acknowledges the SYN; refused and waiting to be
    tried again, none; after the handshake, one in the receive window. Any other answers
    a segment of an earlier try and is dropped: a listening socket that closes while its
    service starts (`nginx -t`) resets what it took, and the request and FIN the peer had
    in flight then reach no socket and draw a reset each, as two SYNs a slow guest
    answers late draw two refusals. Taken, such a reset would end the connection being
    tried again, and the native's answer on it would read as a false "missing"."""
    if fl.state == TcpState.SYN_SENT:
        return bool(f.flags & ACK) and f.ack == fl.seq(1)
    if fl.state == TcpState.REFUSED:
        return False
    if fl.state in (TcpState.ESTABLISHED, TcpState.SYN_RECEIVED):
        return (f.seq - fl.rcv_nxt) & 0xFFFFFFFF < PEER_WINDOW
    return True


class Peer:
    def __init__(self, router_advert=lambda: None) -> None:
        """router_advert(): the router advertisement to answer a router solicitation with
        (inputs.RecordedInputs.router_advert, which a live native may give later)."""
        self.router_advert = router_advert
        self.flows: dict[int, PeerFlow] = {}
        self.by_tuple: dict[tuple, PeerFlow] = {}
        self.ident = 0
        # What the guest sent, as plain values for the run (AnalysisRun.net): each
        # connection's bytes, its datagrams, frames placed nowhere (the first
        # UNKNOWN_KEPT), connections not opened here.
        self.out = NetOutput()
        # UDP the remote side started, (guest port, remote ip, remote port): the guest's
        # datagrams back are answers, not requests (remote.Remote.release notes them).
        self.served: set[tuple[int, bytes, int]] = set()
        # The guest's UDP requests since remote.Remote last took them (exchanges.Answers answers them).
        self.requests: list[netpkt.Frame] = []
        # The guest's SYNs opening connections since remote.Remote last took them: it matches
        # each to a recorded connection (connections.py) and calls answer_syn.
        self.connects: list[netpkt.Frame] = []
        # Connections accepted before it was known which recorded one they are (index -1),
        # and those of them whose first bytes have come: remote.Remote binds each (bind).
        self.unbound: list[PeerFlow] = []
        self.ready: list[PeerFlow] = []
        self.accepted = 0
        # The flows whose guest bytes wait for an ACK (delayed_acks), by identity: looked
        # at every stop, where every flow of a recording would be thousands.
        self.owing: dict[int, PeerFlow] = {}
        # The guest's addresses and ports that have sent a byte on a connection the peer
        # opened: services that have started (_reset_while_starting).
        self.answered: set[tuple[bytes, int]] = set()

    # -- actions of the recorded client --------------------------------------
    def open(self, index: int, client, server, client_mac, guest_mac, now: int) -> list[bytes]:
        fl = PeerFlow(index, client, server, client_mac, guest_mac,
                      isn=(0x1000_0000 + index * 0x0100_0000) & 0xFFFFFFFF)
        self._index(fl, index)
        self.by_tuple[(server[0], server[1], client[0], client[1])] = fl
        fl.state, fl.peer_opened = TcpState.SYN_SENT, True
        fl.snd_nxt = 1
        fl.last_send_ns = fl.opened_ns = now
        return [self._seg(fl, 0, SYN, mss=PEER_MSS)]

    def send(self, index: int, data: bytes, now: int) -> list[bytes]:
        fl = self.flows[index]
        fl.sendbuf += data
        return self._transmit(fl, now)

    def close(self, index: int, now: int) -> list[bytes]:
        fl = self.flows[index]
        fl.fin_queued = True
        return self._transmit(fl, now)

    def reset(self, index: int, now: int) -> list[bytes]:
        fl = self.flows[index]
        if fl.state in (TcpState.CLOSED, TcpState.DONE):
            return []
        fl.end()
        return [self._seg(fl, fl.snd_nxt, RST | ACK)]

    # -- the remote server of a connection the guest opened ------------------------
    def answer_syn(self, index: int | None, syn: netpkt.Frame, now: int, answer: str | None) -> list[bytes]:
        """Answer the guest's SYN as the recorded server answered recorded connection
        `index`: "accepted" (SYN-ACK), "refused" (RST) or None (it never answered: the
        peer keeps silent on this connection). index None: accepted, to be bound to a
        recorded connection by its first bytes (ready, bind)."""
        if answer == "refused":
            if index is not None:
                self.not_opening(index)
            return [self._refusal(syn)]
        self.accepted += 1
        fl = PeerFlow(-1 if index is None else index, (syn.ip_dst, syn.dport), (syn.ip_src, syn.sport), syn.dst,
                      syn.src, isn=(ACCEPT_ISN + self.accepted * 0x0100_0000) & 0xFFFFFFFF)
        self.by_tuple[(syn.ip_src, syn.sport, syn.ip_dst, syn.dport)] = fl
        if index is None:
            self.unbound.append(fl)
        else:
            self._index(fl, index)
        fl.last_send_ns = fl.opened_ns = now
        if answer is None:
            fl.state = TcpState.SILENT
            return []
        fl.state, fl.snd_nxt = TcpState.SYN_RECEIVED, 1
        fl.guest_isn, fl.rcv_nxt = syn.seq, (syn.seq + 1) & 0xFFFFFFFF
        fl.guest_mss, fl.guest_window = syn.mss or 536, syn.window
        return [self._seg(fl, 0, SYN | ACK, mss=PEER_MSS)]

    def bind(self, fl: PeerFlow, index: int) -> None:
        """An unbound connection is recorded connection `index` (its bytes so far count)."""
        self._unbind(fl)
        self._index(fl, index)

    def reset_unbound(self, fl: PeerFlow) -> list[bytes]:
        """An unbound connection no recorded one is left for: reset."""
        self._unbind(fl)
        if fl.state == TcpState.DONE:
            return []
        fl.end()
        return [self._seg(fl, fl.snd_nxt, RST | ACK)]

    def first_bytes(self, fl: PeerFlow) -> bytes:
        """The guest's first bytes on a connection, as many as a recorded request keeps."""
        return fl.out.data.head(REQUEST_KEPT)

    def not_opening(self, index: int) -> None:
        """Recorded connection `index` is not opened here (the native refused it, or never
        answered its SYN): nothing of it to compare, done with at once."""
        self.out.not_opened.add(index)

    def _refusal(self, syn: netpkt.Frame) -> bytes:
        self.ident += 1
        return netpkt.tcp(syn.dst, syn.src, syn.ip_dst, syn.ip_src, syn.dport, syn.sport, 0,
                          (syn.seq + 1) & 0xFFFFFFFF, RST | ACK, 0, ident=self.ident)

    def _index(self, fl: PeerFlow, index: int) -> None:
        """fl is recorded connection `index`: the guest's side of it goes in the run's record."""
        fl.index = index
        self.flows[index] = fl
        self.out.flows[index] = fl.out

    def _unbind(self, fl: PeerFlow) -> None:
        # By identity: a PeerFlow compares equal by value.
        self.unbound = [x for x in self.unbound if x is not fl]

    def _note_ready(self, fl: PeerFlow, f: netpkt.Frame) -> None:
        """An unbound connection's first bytes have come when the guest ends a write
        (PSH), has sent as much as a recorded request keeps, or closes."""
        if all(x is not fl for x in self.ready) and (fl.guest_bytes >= REQUEST_KEPT or f.flags & (FIN | RST)
                                                     or (f.flags & PSH and fl.guest_bytes)):
            self.ready.append(fl)

    # -- what the guest sent --------------------------------------------------
    def on_frame(self, frame: bytes, now: int) -> list[bytes]:
        f = netpkt.parse(frame)
        if f is None:
            return []
        if f.eth_type == netpkt.ETH_ARP and f.arp_op == 1:
            # Who-has from the guest: every address but its own is the network's.
            if f.arp_tpa != f.arp_spa:
                return [netpkt.arp_reply(netpkt.GATEWAY_MAC, f.arp_tpa, f.arp_sha, f.arp_spa)]
            return []
        if f.icmp6_type in (netpkt.ND_NS, netpkt.ND_RS):
            return self._discovery(f)
        if f.eth_type not in (netpkt.ETH_IP, netpkt.ETH_IP6) or f.proto != netpkt.PROTO_TCP:
            if f.eth_type in (netpkt.ETH_IP, netpkt.ETH_IP6) and f.proto == netpkt.PROTO_UDP and not f.fragment:
                self.out.udp_out.append((now, (f.ip_dst, f.dport), f.payload))
                if (f.sport, f.ip_dst, f.dport) not in self.served:
                    self.requests.append(f)
            return []
        fl = self.by_tuple.get((f.ip_src, f.sport, f.ip_dst, f.dport))
        if f.flags & SYN and not f.flags & ACK and (fl is None or fl.state == TcpState.DONE):
            self.connects.append(f)         # a new connection (on a closed one's ports, too)
            return []
        if fl is None:
            if len(self.out.unknown) < UNKNOWN_KEPT:
                self.out.unknown.append(f"TCP from the guest on an unknown connection "
                                    f"{netpkt.ip_str(f.ip_src)}:{f.sport}->{netpkt.ip_str(f.ip_dst)}:{f.dport}")
            return []
        out = self._on_segment(fl, f, now)
        if fl.index < 0:
            self._note_ready(fl, f)
        return out

    def _discovery(self, f: netpkt.Frame) -> list[bytes]:
        """IPv6's ARP (RFC 4861), answered as QEMU's user network answers it: a neighbour
        solicitation for any address but the guest's own (and none from the unspecified
        address: that is the guest checking its own address is unique, which an answer
        would say is taken) by the network's MAC; a router solicitation by the router
        advertisement the native was given (none yet: the guest asks again, 4 s later)."""
        if f.icmp6_type == netpkt.ND_NS:
            if f.ip_src == netpkt.IP6_ANY or f.nd_target in (f.ip_src, b""):
                return []
            return [netpkt.neighbour_advert(netpkt.GATEWAY_MAC, f.nd_target, f.src, f.ip_src)]
        advert = self.router_advert()
        return [advert] if advert else []

    def _on_segment(self, fl: PeerFlow, f: netpkt.Frame, now: int) -> list[bytes]:
        """A segment of the guest's on a connection the peer plays: what to send back."""
        if f.flags & RST:
            if _reset_applies(fl, f):
                self._on_reset(fl, now)
            return []
        if fl.state == TcpState.SYN_RECEIVED:
            if f.flags & SYN:                           # the guest's SYN again: our SYN-ACK once more
                return [self._seg(fl, 0, SYN | ACK, mss=PEER_MSS)]
            if not (f.flags & ACK and f.ack == fl.seq(1)):
                return []
            fl.state, fl.snd_una = TcpState.ESTABLISHED, 1     # and what the ACK carries, below
        if fl.state == TcpState.SYN_SENT:
            return self._on_syn_ack(fl, f, now)
        if fl.state != TcpState.ESTABLISHED:
            return []
        if f.flags & SYN:                               # our ACK of its SYN was lost
            return [self._seg(fl, fl.snd_nxt, ACK)]
        if f.flags & ACK:
            self._on_ack(fl, f)
        need_ack = self._on_payload(fl, f, now) if f.payload else False
        need_ack = self._on_fin(fl, f) or need_ack
        sent = self._transmit(fl, now)
        out = [self._seg(fl, fl.snd_nxt, ACK)] if need_ack and not sent else []
        out += sent
        if fl.fin_sent and fl.snd_una == fl.snd_nxt and fl.out.fin:
            fl.end()
        return out

    def _on_reset(self, fl: PeerFlow, now: int) -> None:
        """The guest reset the connection: refused while it was still starting (retried,
        for SYN_RETRY_FOR_NS), or done with."""
        starting = fl.state == TcpState.SYN_SENT or _reset_while_starting(fl, self.answered)
        if starting and now - fl.opened_ns < SYN_RETRY_FOR_NS:
            fl.state = TcpState.REFUSED     # not listening yet: retry (retransmit())
            fl.refusals += 1
            fl.last_send_ns = now
            fl.snd_una, fl.snd_nxt = 0, 1   # from the SYN again, with everything sent so far
            fl.fin_sent = fl.out.fin = False
            return
        if fl.state != TcpState.DONE:
            fl.out.reset = "refused" if fl.state == TcpState.SYN_SENT else "reset by the guest"
        fl.end()

    def _on_syn_ack(self, fl: PeerFlow, f: netpkt.Frame, now: int) -> list[bytes]:
        """The guest's answer to the peer's SYN: established once it acknowledges it."""
        if not (f.flags & SYN and f.flags & ACK and f.ack == fl.seq(1)):
            return []
        fl.guest_isn = f.seq
        fl.rcv_nxt = (f.seq + 1) & 0xFFFFFFFF
        fl.guest_mss = f.mss or 536
        fl.guest_window = f.window
        fl.snd_una = 1
        fl.state = TcpState.ESTABLISHED
        return [self._seg(fl, fl.snd_nxt, ACK)] + self._transmit(fl, now)

    def _on_ack(self, fl: PeerFlow, f: netpkt.Frame) -> None:
        """What the guest acknowledges of the peer's bytes, and its window."""
        acked = (f.ack - fl.isn) & 0xFFFFFFFF
        if fl.snd_una < acked <= fl.snd_nxt:
            fl.snd_una = acked
            if acked - fl.sendbase >= 4096:         # acknowledged: never sent again
                n = min(acked - fl.sendbase, len(fl.sendbuf))
                del fl.sendbuf[:n]
                fl.sendbase += n
        fl.guest_window = f.window

    def _on_payload(self, fl: PeerFlow, f: netpkt.Frame, now: int) -> bool:
        """The guest's bytes, taken in order; True if they are to be acknowledged at once
        (more than a full segment unacknowledged, or out of order), else the ACK waits
        DELACK_NS for bytes to carry it."""
        if f.seq != fl.rcv_nxt:
            return True                             # retransmitted or early: at once
        fl.rcv_nxt = (fl.rcv_nxt + len(f.payload)) & 0xFFFFFFFF
        if fl.peer_opened and not fl.guest_bytes:
            self.answered.add(fl.server)
        fl.guest_bytes += len(f.payload)
        fl.out.data.append((now, f.payload))
        fl.unacked += len(f.payload)
        if fl.ack_owed_ns is None:
            fl.ack_owed_ns = now
            self.owing[id(fl)] = fl
        return fl.unacked > PEER_MSS

    def _on_fin(self, fl: PeerFlow, f: netpkt.Frame) -> bool:
        """The guest's FIN, taken when it comes in order; True if the segment carries one
        (acknowledged at once, again if it came before)."""
        if not f.flags & FIN:
            return False
        if ((f.seq + len(f.payload)) & 0xFFFFFFFF) == fl.rcv_nxt and not fl.out.fin:
            fl.out.fin = True
            fl.rcv_nxt = (fl.rcv_nxt + 1) & 0xFFFFFFFF
        return True

    # -- segments a release rule sends (semantic/network/rules.py) ------------------------
    def prebuilt(self, fl: PeerFlow, data: bytes, queued: int) -> bytes | None:
        """The segment that will carry `data` once the `queued` bytes before it (in
        rules not fired yet) have gone, as _transmit would send it then: None if it
        would not go as one segment (the guest's MSS or window)."""
        off = fl.snd_nxt + queued
        if fl.state != TcpState.ESTABLISHED or fl.unsent() or not data or len(data) > min(fl.guest_mss, PEER_MSS) \
                or off + len(data) > fl.snd_una + fl.guest_window:
            return None
        return self._frame(fl, off, ACK | PSH, data)

    def sent_by_rule(self, fl: PeerFlow, data: bytes, ack: int, now: int) -> None:
        """QEMU sent a rule's segment (prebuilt) at VM time `now`, acknowledging `ack`."""
        fl.sendbuf += data
        fl.snd_nxt += len(data)
        fl.last_send_ns = now
        if ack == fl.rcv_nxt:
            self._acked(fl)

    # -- sending ----------------------------------------------------------------
    def _transmit(self, fl: PeerFlow, now: int) -> list[bytes]:
        """Send what the guest's window allows."""
        if fl.state != TcpState.ESTABLISHED:
            return []
        out = []
        end = fl.sendbase + len(fl.sendbuf)
        while fl.snd_nxt < end:
            room = fl.snd_una + fl.guest_window - fl.snd_nxt
            n = min(end - fl.snd_nxt, fl.guest_mss, PEER_MSS, room)
            if n <= 0:
                break
            i = fl.snd_nxt - fl.sendbase
            data = bytes(fl.sendbuf[i:i + n])
            out.append(self._seg(fl, fl.snd_nxt, ACK | PSH, data))
            fl.snd_nxt += n
        if fl.fin_queued and not fl.fin_sent and fl.snd_nxt == end:
            out.append(self._seg(fl, fl.snd_nxt, FIN | ACK))
            fl.snd_nxt += 1
            fl.fin_sent = True
        if out:
            fl.last_send_ns = now
        return out

    def retransmit(self, now: int) -> list[bytes]:
        """Resend unacknowledged data older than the retransmission timeout."""
        out = []
        for fl in self.flows.values():
            if (fl.state == TcpState.SYN_SENT and now - fl.last_send_ns >= RTO_NS) or \
                    (fl.state == TcpState.REFUSED and now - fl.last_send_ns >= SYN_RETRY_NS):
                fl.syns_unanswered += fl.state == TcpState.SYN_SENT
                fl.state = TcpState.SYN_SENT
                fl.last_send_ns = now
                out.append(self._seg(fl, 0, SYN, mss=PEER_MSS))
            elif fl.state == TcpState.ESTABLISHED and fl.snd_una < fl.snd_nxt and now - fl.last_send_ns >= RTO_NS:
                fl.snd_nxt = fl.snd_una
                if fl.fin_sent and fl.snd_una == fl.sendbase + len(fl.sendbuf):
                    fl.fin_sent = False
                out += self._transmit(fl, now)
        return out

    def delayed_acks(self, now: int) -> list[bytes]:
        """The ACKs that waited DELACK_NS for bytes to carry them and got none."""
        out = []
        for fl in [fl for fl in self.owing.values() if fl.ack_owed_ns is not None and fl.ack_owed_ns + DELACK_NS <= now]:
            if fl.state == TcpState.ESTABLISHED:
                out.append(self._seg(fl, fl.snd_nxt, ACK))     # _seg takes it off self.owing
            else:                               # closed or reset meanwhile: nothing to acknowledge
                del self.owing[id(fl)]
        return out

    def connecting(self, index: int) -> bool:
        """This peer is still opening connection `index`: its SYN unanswered, or refused
        and retried (a guest still starting its network or its service)."""
        fl = self.flows.get(index)
        return fl is not None and fl.state in (TcpState.SYN_SENT, TcpState.REFUSED)

    def forget(self, index: int) -> None:
        """A connection compared to its end (live_compare), or never opened here: its
        state, and the run's record of it, are no longer needed."""
        self.out.flows.pop(index, None)
        self.out.not_opened.discard(index)
        fl = self.flows.pop(index, None)
        if fl is not None:
            self.owing.pop(id(fl), None)
        if fl is not None and self.by_tuple.get(k := (fl.server[0], fl.server[1], fl.client[0],
                                                       fl.client[1])) is fl:
            del self.by_tuple[k]

    def next_timer(self) -> int | None:
        """VM time of the next retransmission, connection retry or delayed ACK, if any."""
        t = [fl.ack_owed_ns + DELACK_NS for fl in self.owing.values()
             if fl.ack_owed_ns is not None and fl.state == TcpState.ESTABLISHED]
        for fl in self.flows.values():
            if fl.state == TcpState.REFUSED:
                t.append(fl.last_send_ns + SYN_RETRY_NS)
            elif fl.state == TcpState.SYN_SENT or (fl.state == TcpState.ESTABLISHED and fl.snd_una < fl.snd_nxt):
                t.append(fl.last_send_ns + RTO_NS)
        return min(t) if t else None

    def _seg(self, fl: PeerFlow, off: int, flags: int, data: bytes = b"", mss=None) -> bytes:
        """A segment sent now: an ACK in it settles what the guest is owed."""
        if flags & ACK:
            self._acked(fl)
        return self._frame(fl, off, flags, data, mss)

    def _frame(self, fl: PeerFlow, off: int, flags: int, data: bytes = b"", mss=None) -> bytes:
        """The segment at offset `off` of our stream, acknowledging all the guest has sent."""
        self.ident += 1
        return netpkt.tcp(fl.client_mac, fl.guest_mac, fl.client[0], fl.server[0],
                          fl.client[1], fl.server[1], fl.seq(off), fl.rcv_nxt if flags & ACK else 0, flags,
                          PEER_WINDOW, data, mss=mss, ident=self.ident)

    def _acked(self, fl: PeerFlow) -> None:
        """Everything the guest sent is acknowledged: no delayed ACK is owed."""
        fl.ack_owed_ns, fl.unacked = None, 0
        self.owing.pop(id(fl), None)
