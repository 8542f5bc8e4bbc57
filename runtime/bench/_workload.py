"""`warmstart bench`'s workload: a long shared system prompt of company rules and
the questions asked over it, the same in every run and in every process."""

from __future__ import annotations

from ..types import Message

QUESTIONS = [
    "Which rule covers late deliveries?",
    "Summarise rule 7 in one line.",
    "What should I do when a customer is angry?",
    "Which rules mention refunds?",
    "How many rules are there about safety?",
    "What is the first rule?",
    "Explain rule 12 to a new colleague.",
    "Which rule is the strictest?",
    "Is overtime covered anywhere?",
    "What do the rules say about email?",
    "Give me a checklist for Monday mornings.",
    "Which rule would you change?",
    "What does rule 3 protect against?",
    "Which rules apply to visitors?",
    "What is said about passwords?",
    "How are holidays handled?",
    "Which rule talks about the kitchen?",
    "What happens after an accident?",
    "Who approves purchases?",
    "What is the last rule about?",
]
FOLLOW_UP = "Thanks. And in one word?"
TOPICS = [
    "deliveries",
    "refunds",
    "safety",
    "visitors",
    "passwords",
    "holidays",
    "email",
    "purchases",
    "the kitchen",
    "accidents",
    "overtime",
    "customers",
    "meetings",
]


def system_prompt(n_rules: int) -> str:
    rules = [
        f"Rule {i + 1}: every question about {TOPICS[i % len(TOPICS)]} goes to team "
        f"{chr(65 + i % 26)}, is answered within {i % 5 + 1} working days, and is "
        f"logged with reference {1000 + 7 * i}."
        for i in range(n_rules)
    ]
    return "You are the office assistant of a small company. Company rules:\n" + "\n".join(rules)


def conversation(system: str, i: int, follow_up: str | None = None) -> tuple[Message, ...]:
    msgs = [
        Message("system", system),
        Message("user", QUESTIONS[i % len(QUESTIONS)] + ("" if i < len(QUESTIONS) else f" ({i})")),
    ]
    if follow_up is not None:
        msgs += [Message("assistant", follow_up), Message("user", FOLLOW_UP)]
    return tuple(msgs)
