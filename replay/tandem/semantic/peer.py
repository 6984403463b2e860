"""The remote side of the network, played for an analysis guest.

A different kernel picks its own sequence numbers, windows and segment sizes,
so the recorded client packets cannot be replayed as they are. The peer opens
each recorded connection itself (as COLO's filter-rewriter and tcpliveplay do,
it speaks with the analysis guest's own sequence numbers), carries the recorded
client payload, respects the guest's window and MSS, acknowledges what the
guest sends (again if the guest retransmits), retransmits its own data when
unacknowledged, and closes as the client did (FIN or RST). It answers ARP for
the network's addresses, and hands the guest's own UDP requests to the driver, which
answers them from the recording (exchanges.py). Everything happens at VM times the
caller gives.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..formats import netpkt
from ..formats.netpkt import ACK, FIN, PSH, RST, SYN
from .inputs import Chunks

UNKNOWN_KEPT = 100
PEER_WINDOW = 65535
PEER_MSS = 1460
RTO_NS = 200_000_000        # VM time before unacknowledged data is sent again
SYN_RETRY_NS = 50_000_000   # a refused connection (service not listening yet) is retried
SYN_RETRY_FOR_NS = 60_000_000_000   # ... for this long, like a patient client


@dataclass
class PeerFlow:
    index: int
    client: tuple[bytes, int]
    server: tuple[bytes, int]
    client_mac: bytes
    guest_mac: bytes
    isn: int
    state: str = "closed"       # closed | syn-sent | refused | established | done
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
    guest_data: Chunks = field(default_factory=Chunks)  # (VM ns, in-order payload)
    guest_fin: bool = False
    last_send_ns: int = 0
    opened_ns: int = 0
    refusals: int = 0
    reset: str | None = None    # why the guest reset the connection

    def seq(self, off: int) -> int:
        return (self.isn + off) & 0xFFFFFFFF


class Peer:
    def __init__(self) -> None:
        self.flows: dict[int, PeerFlow] = {}
        self.by_tuple: dict[tuple, PeerFlow] = {}
        self.ident = 0
        self.unknown: list[str] = []    # guest frames the peer could not place (the first UNKNOWN_KEPT)
        # The guest's UDP datagrams, (VM ns, (dst ip, port), payload): kept for the
        # comparator, since every guest frame is parsed here anyway.
        self.udp_out: list[tuple[int, tuple[bytes, int], bytes]] = []
        # Connections the native refused, not opened here (driver.release_input): done
        # with as soon as their time has come (semantic/live_compare.py retires them).
        self.not_opened: set[int] = set()
        # UDP the remote side started, (guest port, remote ip, remote port): the guest's
        # datagrams back are answers, not requests (driver.release_input notes them).
        self.served: set[tuple[int, bytes, int]] = set()
        # The guest's UDP requests since the driver last took them (exchanges.Answers answers them).
        self.requests: list[netpkt.Frame] = []

    # -- actions of the recorded client --------------------------------------
    def open(self, index: int, client, server, client_mac, guest_mac, now: int) -> list[bytes]:
        fl = PeerFlow(index, client, server, client_mac, guest_mac,
                      isn=(0x1000_0000 + index * 0x0100_0000) & 0xFFFFFFFF)
        self.flows[index] = fl
        self.by_tuple[(server[0], server[1], client[0], client[1])] = fl
        fl.state = "syn-sent"
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
        if fl.state in ("closed", "done"):
            return []
        fl.state = "done"
        return [self._seg(fl, fl.snd_nxt, RST | ACK)]

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
        if f.eth_type != netpkt.ETH_IP or f.proto != netpkt.PROTO_TCP:
            if f.eth_type == netpkt.ETH_IP and f.proto == netpkt.PROTO_UDP and not f.fragment:
                self.udp_out.append((now, (f.ip_dst, f.dport), f.payload))
                if (f.sport, f.ip_dst, f.dport) not in self.served:
                    self.requests.append(f)
            return []
        fl = self.by_tuple.get((f.ip_src, f.sport, f.ip_dst, f.dport))
        if fl is None:
            if len(self.unknown) < UNKNOWN_KEPT:
                self.unknown.append(f"TCP from the guest on an unknown connection "
                                    f"{netpkt.ip_str(f.ip_src)}:{f.sport}->{netpkt.ip_str(f.ip_dst)}:{f.dport}")
            return []
        return self._on_segment(fl, f, now)

    def _on_segment(self, fl: PeerFlow, f, now: int) -> list[bytes]:
        out: list[bytes] = []
        if f.flags & RST:
            if fl.state == "syn-sent" and now - fl.opened_ns < SYN_RETRY_FOR_NS:
                fl.state = "refused"            # not listening yet: retry (retransmit())
                fl.refusals += 1
                fl.last_send_ns = now
                return out
            if fl.state != "done":
                fl.reset = "refused" if fl.state == "syn-sent" else "reset by the guest"
            fl.state = "done"
            return out
        if fl.state == "syn-sent":
            if f.flags & SYN and f.flags & ACK and f.ack == fl.seq(1):
                fl.guest_isn = f.seq
                fl.rcv_nxt = (f.seq + 1) & 0xFFFFFFFF
                fl.guest_mss = f.mss or 536
                fl.guest_window = f.window
                fl.snd_una = 1
                fl.state = "established"
                out.append(self._seg(fl, fl.snd_nxt, ACK))
                out += self._transmit(fl, now)
            return out
        if fl.state != "established":
            return out
        if f.flags & SYN:                               # our ACK of its SYN was lost
            return [self._seg(fl, fl.snd_nxt, ACK)]
        if f.flags & ACK:
            acked = (f.ack - fl.isn) & 0xFFFFFFFF
            if fl.snd_una < acked <= fl.snd_nxt:
                fl.snd_una = acked
                if acked - fl.sendbase >= 4096:         # acknowledged: never sent again
                    n = min(acked - fl.sendbase, len(fl.sendbuf))
                    del fl.sendbuf[:n]
                    fl.sendbase += n
            fl.guest_window = f.window
        need_ack = False
        if f.payload:
            if f.seq == fl.rcv_nxt:
                fl.rcv_nxt = (fl.rcv_nxt + len(f.payload)) & 0xFFFFFFFF
                fl.guest_bytes += len(f.payload)
                fl.guest_data.append((now, f.payload))
            need_ack = True                             # in order, retransmitted or early
        if f.flags & FIN and ((f.seq + len(f.payload)) & 0xFFFFFFFF) == fl.rcv_nxt and not fl.guest_fin:
            fl.guest_fin = True
            fl.rcv_nxt = (fl.rcv_nxt + 1) & 0xFFFFFFFF
            need_ack = True
        elif f.flags & FIN:
            need_ack = True
        sent = self._transmit(fl, now)
        if need_ack and not sent:
            out.append(self._seg(fl, fl.snd_nxt, ACK))
        out += sent
        if fl.fin_sent and fl.snd_una == fl.snd_nxt and fl.guest_fin:
            fl.state = "done"
        return out

    # -- sending ----------------------------------------------------------------
    def _transmit(self, fl: PeerFlow, now: int) -> list[bytes]:
        """Send what the guest's window allows."""
        if fl.state != "established":
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
            if (fl.state == "syn-sent" and now - fl.last_send_ns >= RTO_NS) or \
                    (fl.state == "refused" and now - fl.last_send_ns >= SYN_RETRY_NS):
                fl.state = "syn-sent"
                fl.last_send_ns = now
                out.append(self._seg(fl, 0, SYN, mss=PEER_MSS))
            elif fl.state == "established" and fl.snd_una < fl.snd_nxt and now - fl.last_send_ns >= RTO_NS:
                fl.snd_nxt = fl.snd_una
                if fl.fin_sent and fl.snd_una == fl.sendbase + len(fl.sendbuf):
                    fl.fin_sent = False
                out += self._transmit(fl, now)
        return out

    def forget(self, index: int) -> None:
        """A connection compared to its end (live_compare): its state is no longer needed."""
        fl = self.flows.pop(index, None)
        if fl is not None and self.by_tuple.get(k := (fl.server[0], fl.server[1], fl.client[0],
                                                       fl.client[1])) is fl:
            del self.by_tuple[k]

    def next_timer(self) -> int | None:
        """VM time of the next retransmission or connection retry, if any."""
        t = []
        for fl in self.flows.values():
            if fl.state == "refused":
                t.append(fl.last_send_ns + SYN_RETRY_NS)
            elif fl.state == "syn-sent" or (fl.state == "established" and fl.snd_una < fl.snd_nxt):
                t.append(fl.last_send_ns + RTO_NS)
        return min(t) if t else None

    def _seg(self, fl: PeerFlow, off: int, flags: int, data: bytes = b"", mss=None) -> bytes:
        self.ident += 1
        ack = fl.rcv_nxt if flags & ACK else 0
        return netpkt.tcp(fl.client_mac, fl.guest_mac, fl.client[0], fl.server[0],
                          fl.client[1], fl.server[1], fl.seq(off), ack, flags,
                          PEER_WINDOW, data, mss=mss, ident=self.ident)
