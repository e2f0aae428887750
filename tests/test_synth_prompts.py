"""Prompt composition: copied spans, templates, exact reconstruction and coverage."""
from __future__ import annotations

import json
import random

import duckdb

from synth.profile_section import build_workflows_section, evaluate_workflows
from synth.prompts import (TextCall, evaluate_templates, fill_template, learn_templates,
                           render_prompt, segment_prompt, template_string)

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
SYSTEM = {"planner": "You plan the work. Answer with a numbered list of steps.",
          "coder": "You write code. Reply with a unified diff and a short rationale."}


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def conversation(seed: int) -> list[TextCall]:
    """planner(task) → coder(task + plan) → coder(previous prompt + its diff + test output)."""
    rng = random.Random(seed)
    task = "Task: " + words(rng, rng.randint(20, 40))
    plan = "1. " + words(rng, rng.randint(15, 30))
    diff = "--- a/x.py\n+++ b/x.py\n" + words(rng, rng.randint(15, 30))
    p1 = render_prompt([{"role": "system", "content": SYSTEM["planner"]},
                        {"role": "user", "content": task}])
    p2 = render_prompt([{"role": "system", "content": SYSTEM["coder"]},
                        {"role": "user", "content": f"{task}\n\nPlan:\n{plan}"}])
    p3 = p2 + "\n" + render_prompt([{"role": "assistant", "content": diff},
                                    {"role": "user", "content": "tests: " + words(rng, 12)}])
    return [TextCall("planner", p1, plan), TextCall("coder", p2, diff),
            TextCall("coder", p3, "--- done\n" + words(rng, 10))]


def test_render_prompt_accepts_json_and_content_parts():
    messages = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image"}]}]
    assert render_prompt(json.dumps(messages)) == "[system]\nbe brief\n[user]\nhi"
    assert render_prompt(None) == ""


def test_segmentation_finds_whole_edge_and_middle_copies():
    history = [TextCall("a", "REQ " * 20, "the quick brown fox jumps over the lazy dog " * 3)]
    response = history[0].response
    prompt = "intro " + response + " middle " + ("REQ " * 20)[8:50] + " outro"
    parts = segment_prompt(prompt, history, min_match=16)
    refs = [p for p in parts if p[0] == "ref"]
    assert ("ref", 1, "response", 0, len(response), len(response)) in refs
    assert any(p[2] == "request" and p[4] - p[3] >= 40 for p in refs)
    rebuilt = "".join(p[1] if p[0] == "text" else getattr(history[-p[1]], p[2])[p[3]:p[4]]
                      for p in parts)
    assert rebuilt == prompt


def test_templates_rebuild_held_out_prompts():
    train = [conversation(s) for s in range(30)]
    templates = learn_templates(train)
    coder = template_string(templates["coder"])
    assert "${req_1:response:[0,end]}" in coder  # the plan or the diff, pasted whole
    assert coder.startswith("[system]\nYou write code.")
    held_out = [conversation(s) for s in range(100, 120)]
    result = evaluate_templates(templates, held_out)
    assert result["n_prompts"] == 60
    # the second coder prompt is fully determined by history except the new test output
    assert 0.3 < result["covered_char_share"] < 1.0
    assert 0.0 <= result["exact_share"] < 0.5
    third = held_out[0][2]
    filled = fill_template(templates["coder"], held_out[0][:2])
    assert all(piece is None or piece in third.request for piece in filled)


def test_prompt_composition_flows_through_the_section_and_eval():
    con = duckdb.connect()
    con.execute("""CREATE TABLE calls (request_id VARCHAR, workflow_type_id VARCHAR,
        workflow_id VARCHAR, agent_id VARCHAR, t_arrival DOUBLE, t_finish DOUBLE,
        parent_request_ids VARCHAR[], tool_names VARCHAR[], messages JSON,
        response_text VARCHAR)""")
    for w in range(20):
        for i, call in enumerate(conversation(w)):
            user = call.request  # store the rendered prompt as one user message
            con.execute("INSERT INTO calls VALUES (?, 'app', ?, ?, ?, ?, NULL, [], ?, ?)",
                        [f"{w}-{i}", f"w{w}", call.agent_id, 100.0 * w + 10 * i,
                         100.0 * w + 10 * i + 5, json.dumps([{"role": "user", "content": user}]),
                         call.response])
    section = build_workflows_section(con, {})["app"]
    assert section["regex"] == "planner (coder){2}"
    block = section["prompt_composition"]
    assert block["unit"] == "characters" and set(block["templates"]) == {"planner", "coder"}
    result = evaluate_workflows({"workflows": {"app": section}}, con)
    assert result["prompt_composition"]["n_prompts"] == 60
    assert result["prompt_composition"]["covered_char_share"] > 0.3
