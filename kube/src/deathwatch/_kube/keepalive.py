"""How long an idle connection to the API server is kept, and how it is kept (ADR 0034): the
one policy of the controller's pools (deathwatch._api.rest) and the exits container's kept
connection (deathwatch.firewall.exits), written once.

The API server closes a connection idle for 90 s (measured on the local control plane; a
load balancer before it may do the same), so a client keeps one idle for less than that and
uses it before then with the cheapest request it serves."""

from __future__ import annotations

from typing import Final

IDLE_KEPT: Final = 75.0  # seconds an idle connection is kept, and used again by then (< 90)
# readable by every identity (system:public-info-viewer), no storage behind it; any answer,
# a refusal too, came on the connection and kept it
WARM_PATH: Final = "/version"
