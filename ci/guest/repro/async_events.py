#!/usr/bin/env python3
"""Print the asynchronous events an RDMA device delivers (ci-lib.sh, erdma-faults cell).

    async_events.py --dev erdma_0 [--qp] [--count N]

Opens the device (pyverbs, the guest's rdma-core). With --qp it also creates
a PD, a CQ and an RC QP and prints `QPN=<n>`, so that a QP event (an erdma
AEQ entry for that QP) reaches this process: the kernel hands a QP's events
only to the context that created it. Port events (IB_EVENT_PORT_ERR/ACTIVE)
reach every context. Each event is printed as
`ASYNC-EVENT <IBV_EVENT_...> (<n>)`, acknowledged, and, for --qp, followed
by `QP-STATE=<ibv_qp_state>` as ibv_query_qp reports it afterwards. Exits
after N events (default 1); run it under `timeout`.
"""

import argparse
import sys

import pyverbs.enums as e
from pyverbs.cq import CQ
from pyverbs.device import Context, translate_event_type
from pyverbs.pd import PD
from pyverbs.qp import QP, QPCap, QPInitAttr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dev", required=True)
    ap.add_argument("--qp", action="store_true", help="create an RC QP and print its number")
    ap.add_argument("--count", type=int, default=1)
    a = ap.parse_args()
    ctx = Context(name=a.dev)
    qp = None
    if a.qp:
        pd = PD(ctx)
        cq = CQ(ctx, 16)
        qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq,
                               cap=QPCap(max_send_wr=4, max_recv_wr=4)))
        print(f"QPN={qp.qp_num}", flush=True)
    print("READY", flush=True)
    for _ in range(a.count):
        ev = ctx.get_async_event()
        print(f"ASYNC-EVENT {translate_event_type(ev.event_type)} ({ev.event_type})", flush=True)
        ev.ack()
        if qp is not None:
            attr, _ = qp.query(e.IBV_QP_STATE)
            print(f"QP-STATE={attr.qp_state}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
