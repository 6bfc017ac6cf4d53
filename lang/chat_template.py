"""Role markers taken from the model's own (Jinja) chat template, so programs match the server's prompts."""

from __future__ import annotations

from dataclasses import dataclass

SENTINEL = "\x00RADIXLM_CONTENT\x00"


@dataclass(frozen=True)
class RoleTemplate:
    prefix: dict[str, str]  # role -> text before the content
    suffix: dict[str, str]  # role -> text after the content
    default_system: str = ""  # what the template inserts when a conversation has no system message

    @classmethod
    def from_jinja(cls, template: str, bos_token: str = "", eos_token: str = "") -> RoleTemplate:
        import jinja2

        env = jinja2.Environment(undefined=jinja2.Undefined)  # noqa: S701 - renders text for a prompt, not HTML
        tpl = env.from_string(template)

        def render(messages, gen=False) -> str:
            return tpl.render(messages=messages, add_generation_prompt=gen, bos_token=bos_token,
                              eos_token=eos_token)

        prefix, suffix = {}, {}
        for role in ("system", "user", "assistant"):
            msgs = [{"role": "system", "content": "S"}] if role != "system" else []
            base = render(msgs) if msgs else ""
            full = render(msgs + [{"role": role, "content": SENTINEL}])
            if not full.startswith(base) or SENTINEL not in full:
                raise ValueError(f"chat template: cannot find the markers of role {role!r}")
            piece = full[len(base):]
            prefix[role], suffix[role] = piece.split(SENTINEL, 1)
        assistant_gen = render([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}], gen=True)
        no_gen = render([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}])
        if assistant_gen.startswith(no_gen):
            prefix["assistant"] = assistant_gen[len(no_gen):] or prefix["assistant"]
        no_system = render([{"role": "user", "content": SENTINEL}])
        default_system = no_system.split(prefix["user"] + SENTINEL, 1)[0] if prefix["user"] else ""
        return cls(prefix, suffix, default_system)

    def begin(self, role: str, first: bool) -> str:
        if role not in self.prefix:
            raise ValueError(f"role must be one of {sorted(self.prefix)}, got {role!r}")
        lead = self.default_system if first and role != "system" else ""
        return lead + self.prefix[role]

    def end(self, role: str) -> str:
        return self.suffix[role]


PLAIN = RoleTemplate(prefix={"system": "", "user": "User: ", "assistant": "Assistant: "},
                     suffix={"system": "\n", "user": "\n", "assistant": "\n"})
