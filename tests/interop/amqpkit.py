"""What the AMQP interop tests share: a gateway with an AMQP listener on a free port, and the
check that an attach is refused with a given condition."""
from __future__ import annotations

import pytest
from proton.utils import LinkDetached

from gateway_proc import HOST, free_port, start_gateway


def amqp_gateway(*extra: str, **kw):
    """`start_gateway` with `--amqp-addr` on a free port (as `.amqp_port`), plus `extra` flags."""
    port = free_port()
    g = start_gateway(["--amqp-addr", f"{HOST}:{port}", *extra], **kw)
    g.amqp_port = port
    return g


def refused(attach, condition: str) -> str:
    """Calls `attach` (a create_receiver/create_sender), which the gateway must answer with a
    DETACH carrying `condition`; returns the detach text."""
    with pytest.raises(LinkDetached) as e:
        attach()
    text = str(e.value)
    assert condition in text, text
    return text
