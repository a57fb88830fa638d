"""One pass per input, each a module of free functions that judges it on the controller's
memory and ends in `Core.settle`: a pod event (`pods`), a DeathWatch or a Sandbox (`owners`),
a SandboxVerdict (`verdict_watch`), a node's exit (`node_exits`), coverage changing
(`shielding`), the clock (`publishing`, `retention`), an event delivered
(`delivery_bridge`), this replica taking over the writing (`takeover`). No I/O."""
