#!/usr/bin/env python3
"""Does DEVICE's query_qp return attributes it never wrote? (docs/upstream-suites.md)

ib_uverbs_query_qp (drivers/infiniband/core/uverbs_cmd.c) allocates the
ib_qp_attr it hands the driver with kmalloc, not zeroed, and copies every
field to user space. A driver that leaves a field unset returns whatever
that slab object held before. ib_uverbs_modify_qp fills an attr of the same
size from the command (timeout included when IBV_QP_TIMEOUT is in the mask)
and frees it when the modify returns, whether it succeeded or not.

So: ask a scratch QP for RESET -> INIT with a chosen `timeout` in the mask
(not an attribute of that transition: the driver may refuse it, rxe does),
then query another QP, a probe that was never given a timeout. A driver
that fills qp_attr->timeout returns the probe's own timeout (0, as rxe
does); erdma 7.3 returns the scratch modify's value: uninitialized kernel
memory reaching user space.

Prints one line per round and "RESULT device=D echoed=N/ROUNDS". Python 3 and pyverbs.
"""
import sys

import pyverbs.device as d
import pyverbs.enums as e
from pyverbs.cq import CQ
from pyverbs.pd import PD
from pyverbs.pyverbs_error import PyverbsRDMAError
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr

MARKS = (3, 9, 17, 21, 5, 30, 12, 26)


def main():
    dev = sys.argv[1]
    ctx = d.Context(name=dev)
    pd = PD(ctx)
    cq = CQ(ctx, 64)
    cap = QPCap(max_send_wr=4, max_recv_wr=4, max_send_sge=1, max_recv_sge=1)
    init = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap)
    probe = QP(pd, init)
    mask = (e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_ACCESS_FLAGS
            | e.IBV_QP_TIMEOUT)
    echoed = 0
    for i, mark in enumerate(MARKS):
        scratch = QP(pd, init)
        attr = QPAttr(qp_state=e.IBV_QPS_INIT, cur_qp_state=e.IBV_QPS_RESET)
        attr.pkey_index = 0
        attr.port_num = 1
        attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE
        attr.timeout = mark
        try:
            scratch.modify(attr, mask)
            how = "accepted"
        except PyverbsRDMAError as ex:
            how = f"refused, errno {ex.error_code}"
        got, _ = probe.query(e.IBV_QP_TIMEOUT)
        echoed += got.timeout == mark
        print(f"round {i}: modify(scratch RESET->INIT, timeout={mark}) {how} -> query(probe).timeout={got.timeout}")
        scratch.close()
    print(f"RESULT device={dev} echoed={echoed}/{len(MARKS)}")


if __name__ == "__main__":
    main()
