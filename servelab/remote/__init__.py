"""Remote hosts: `up`, `doctor`, `verify` and `bench` with `--on ssh://[user@]host[:port]`, or on a node of a Ray
cluster chosen by resources, `--on ray:GPU=8` (and an experiment cell's `on:`, either way).

The far side runs servelab itself, the same commands as a local run: one code path, the host a parameter. What
travels between the two is small and line-based (protocol.py), over a link (link.py): the system's OpenSSH client
with a control master (connection.py), so the user's ~/.ssh/config, agent, keys, ProxyJump and known_hosts apply
as they do to `ssh` typed by hand; or a Ray actor that holds the resources asked for and runs the same far-side
commands on its node (ray_link.py).

- placement.py   what `--on` names: an ssh:// URL (target.py) or a Ray placement, ray:GPU=8,CPU=4 (no Ray needed)
- link.py        what the controller talks to: a link that runs a far-side command and streams one
- target.py      the ssh:// URL and the ssh command line built from it
- connection.py  the SSH link: one control master per command; OpenSSH's failures in one line each
- ray_link.py    the Ray link: an actor holding the placement's resources runs the far side's commands there
- protocol.py    the events file's lines and the compatibility rule between two servelab versions
- agent.py       the far side: hello, start (a detached worker), follow, pack
- worker.py      the far side's detached process: the command, its output as events, the controller watchdog
- events_view.py a start-up's live statuses written as events there, drawn by the same view here
- controller.py  this side: start, follow (reconnecting), Ctrl-C, the results copied back and checked
- commands.py    what cli.py calls for each command with --on
"""
