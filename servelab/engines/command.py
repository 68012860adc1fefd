"""Any server, from a command line and a URL: the escape hatch for engines servelab has no adapter for.

    servelab up command --extra "python -m my_server --port {port}" --option probe_path=/health \\
        --option ready_regex="Serving on" --option "phase.loading=Loading weights"

`{port}` and `{host}` in the command are filled in. Options: `url` (default http://HOST:PORT), `probe_path`
(default /health; 200 = ready, 503 = loading), `ready_regex`, and `phase.NAME=REGEX` for each phase to follow,
in order. Without phase patterns the timeline is just starting → ready, but liveness evidence still works.
"""

from __future__ import annotations

import re
import shutil

from servelab.engines.base import EngineAdapter, EngineSpec, Launch, PhasePattern
from servelab.engines.common import base_url
from servelab.errors import UserError


class CommandEngine(EngineAdapter):
    name = "command"
    counts_prompts_by_usage = False  # whatever the command serves: it is not known what counting costs there
    title = "command"
    install_hint = "give the command with --extra \"PROGRAM ARGS ... {port}\""

    def require(self, spec: EngineSpec) -> None:
        if not spec.extra_args:
            raise UserError("the command engine needs a command line", hint=self.install_hint)
        program = spec.extra_args[0]
        if shutil.which(program) is None:
            raise UserError(f"command: '{program}' was not found on PATH or is not executable",
                            hint="give the full path of the program")

    def build(self, spec: EngineSpec, port: int) -> Launch:
        if not spec.extra_args:
            raise UserError("the command engine needs a command line", hint=self.install_hint)
        fill = {"port": str(port), "host": spec.host}
        command = [arg.replace("{port}", fill["port"]).replace("{host}", fill["host"]) for arg in spec.extra_args]
        options = spec.options
        # Instance attributes shadow the class defaults: the tracker and the prober read them from this instance.
        self.title = f"command ({command[0]})"
        self.probe_path = options.get("probe_path", "/health")
        try:
            self.ready_line = re.compile(options["ready_regex"]) if options.get("ready_regex") else None
            self.phases = [PhasePattern(key.removeprefix("phase."), re.compile(value))
                           for key, value in options.items() if key.startswith("phase.")]
        except re.error as exc:
            raise UserError(f"command: invalid regular expression: {exc}") from None
        url = options.get("url", base_url(spec, port)).replace("{port}", fill["port"])
        return Launch(command=command, env=dict(spec.env), url=url.rstrip("/"), model_path=None,
                      served_model=options.get("model"))
