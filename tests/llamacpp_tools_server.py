"""servelab's embedded-engine launcher (servelab.engines.llamacpp_server) with a chat template that renders tools,
for tests/test_bench_tools.py: SmolLM2's own template drops `tools` (verify's tool checks see that skip), so the
model would never be asked to call one. This ChatML template (SmolLM2's own tokens) lists the tools in a system
turn and asks for Hermes-style `<tool_call>{"name": ..., "arguments": ...}</tool_call>` blocks; llama.cpp's jinja
path recognises that format from the template, constrains the output to it when tool_choice is "required", parses
the blocks and streams them as `tool_calls` deltas. Every other flag is the launcher's own:
`python tests/llamacpp_tools_server.py --model X --port P ...`."""

from __future__ import annotations

import sys

import xllamacpp

from servelab.engines import llamacpp_server

TOOLS_TEMPLATE = """\
{%- if tools %}<|im_start|>system
You may call one or more functions to answer the user. The functions are listed in <tools></tools>:
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
For each call, return a JSON object with the function's name and arguments inside <tool_call></tool_call> tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == "assistant" and message.tool_calls %}
{{- '<|im_start|>assistant' }}
{%- if message.content %}{{ '\n' + message.content }}{% endif %}
{%- for tool_call in message.tool_calls %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '\n<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' }}{{ tool_call.arguments | tojson }}{{ '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message.role == "tool" %}
{{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"""

_plain_params = xllamacpp.CommonParams


def tools_params() -> xllamacpp.CommonParams:
    params = _plain_params()
    params.use_jinja = True
    params.chat_template = TOOLS_TEMPLATE
    return params


if __name__ == "__main__":
    xllamacpp.CommonParams = tools_params  # the launcher builds its parameters from this name
    sys.exit(llamacpp_server.main())
