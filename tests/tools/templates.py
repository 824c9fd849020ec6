"""Small chat templates in the style of each tool-calling family (written for these tests, shaped like the
real ones: how they print tools, an assistant's tool_calls and tool results)."""

HERMES = """{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
For each function call, return <tool_call>{"name": <function-name>, "arguments": <args-json-object>}</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'user' %}<|im_start|>user
{{ message.content }}<|im_end|>
{% elif message.role == 'assistant' %}<|im_start|>assistant
{% if message.content %}{{ message.content }}
{% endif %}{% for tc in message.tool_calls or [] %}<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

LLAMA3 = """{{- bos_token }}<|start_header_id|>system<|end_header_id|>

Environment: ipython
{% if messages[0].role == 'system' %}{{ messages[0].content }}{% endif %}<|eot_id|>
{%- if tools %}<|start_header_id|>user<|end_header_id|>

Given the following functions, respond with a JSON for a function call with its proper arguments.
Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.
{% for t in tools %}{{ t | tojson(indent=4) }}

{% endfor %}<|eot_id|>
{%- endif %}
{%- for message in messages if message.role != 'system' %}
{%- if message.tool_calls %}
{%- if message.tool_calls | length != 1 %}{{ raise_exception("This model only supports single tool-calls at once!") }}{% endif %}
{%- set tc = message.tool_calls[0].function %}<|start_header_id|>assistant<|end_header_id|>

{"name": "{{ tc.name }}", "parameters": {{ tc.arguments | tojson }}}<|eot_id|>
{%- elif message.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>

{{ message.content }}<|eot_id|>
{%- else %}<|start_header_id|>{{ message.role }}<|end_header_id|>

{{ message.content }}<|eot_id|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""

MISTRAL = """{{- bos_token }}
{%- for message in messages %}
{%- if message.role == 'user' %}
{%- if loop.last and tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}[INST]{{ message.content }}[/INST]
{%- elif message.tool_calls %}[TOOL_CALLS][
{%- for tc in message.tool_calls %}
{%- if tc.id | length != 9 %}{{ raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}{% endif %}
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}, "id": "{{ tc.id }}"}{% if not loop.last %}, {% endif %}
{%- endfor %}]{{ eos_token }}
{%- elif message.role == 'tool' %}[TOOL_RESULTS]{"content": {{ message.content | tojson }}, "call_id": "{{ message.tool_call_id }}"}[/TOOL_RESULTS]
{%- elif message.role == 'assistant' %}{{ message.content }}{{ eos_token }}
{%- endif %}
{%- endfor %}"""

CHATML_NO_TOOLS = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
