"""What a narrowing does to open relayed connections (relay.cut_unlisted): those the new policy
no longer allows end; their records say why; one whose box had finished keeps its decision."""

from __future__ import annotations

from execbox.egress import audit
from execbox.egress.policy import parse_policy
from execbox.egress.relay import cut_unlisted


class Relay:
    def __init__(self, host: str | None, ip: str, port: int, box_done: bool = False) -> None:
        self.rec = audit.AuditRecord("b", "tcp", host, ip, port, decision="allowed", reason=f"{host} allowed")
        self.box_done = box_done
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True


def test_a_narrowing_ends_what_it_no_longer_allows_and_keeps_the_rest():
    kept = Relay("api.example.com", "93.184.216.34", 443)
    gone = Relay("www.example.com", "93.184.216.35", 443)
    by_ip = Relay(None, "93.184.216.36", 80)
    finished = Relay("www.example.com", "93.184.216.35", 80, box_done=True)
    n = cut_unlisted([kept, gone, by_ip, finished], parse_policy("allowlist", ["api.example.com:443"]))
    assert n == 3 and not kept.aborted and gone.aborted and by_ip.aborted and finished.aborted
    assert (gone.rec.decision, by_ip.rec.decision) == ("limited", "limited")
    assert "narrowed" in gone.rec.reason and kept.rec.reason == "api.example.com allowed"
    # the box had sent all it would: the cut took only the upstream's tail
    assert finished.rec.decision == "allowed" and finished.rec.reason.endswith("(after the box had finished sending)")


def test_none_ends_every_connection():
    rs = [Relay("api.example.com", "93.184.216.34", 443), Relay(None, "93.184.216.36", 80)]
    assert cut_unlisted(rs, parse_policy("none")) == 2 and all(r.aborted for r in rs)
