// The example's page (issue #34): enqueue a question for the `writer` agent, then follow the job's events
// (GET /jobs/{id}/events, Server-Sent Events). Text deltas grow the answer; a `turn-started` (a new attempt
// after a worker died, or a provider retry) drops what the turn had shown. The browser resumes a dropped
// connection with Last-Event-ID on its own; the `end` event closes the stream once the run stops.
"use strict";

const answer = document.getElementById("answer");
const statusLine = document.getElementById("status");
const log = document.getElementById("events");
let turns = new Map(); // turn -> its text so far

function render() {
  answer.textContent = [...turns.keys()].sort((a, b) => a - b).map((t) => turns.get(t)).join("\n");
}

function note(kind, event) {
  const item = document.createElement("li");
  item.textContent = `${kind} ${event.turn ?? ""} ${event.attempt ? "attempt " + event.attempt : ""}`.trim();
  log.appendChild(item);
}

function follow(sessionId) {
  turns = new Map();
  render();
  const source = new EventSource(`/jobs/${encodeURIComponent(sessionId)}/events`);
  source.addEventListener("turn-started", (message) => {
    const event = JSON.parse(message.data);
    turns.set(event.turn, "");
    note("turn-started", event);
    render();
  });
  source.addEventListener("text-delta", (message) => {
    const event = JSON.parse(message.data);
    turns.set(event.turn, (turns.get(event.turn) || "") + event.text);
    render();
  });
  for (const kind of ["tool-call-started", "tool-call-finished", "approval-requested", "checkpoint-saved",
                      "requeued", "finished", "failed", "parked", "aborted"]) {
    source.addEventListener(kind, (message) => note(kind, JSON.parse(message.data)));
  }
  source.addEventListener("end", (message) => {
    const status = JSON.parse(message.data);
    statusLine.textContent = status.status;
    if (status.text !== null && status.status === "finished") {
      answer.textContent = status.text; // the checkpoint is the truth
    }
    source.close();
  });
}

document.getElementById("ask").addEventListener("submit", async (submitted) => {
  submitted.preventDefault();
  statusLine.textContent = "in-progress";
  const question = document.getElementById("question").value;
  const response = await fetch("/jobs", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ agent: "writer", input: question }),
  });
  const job = await response.json();
  if (!response.ok) {
    statusLine.textContent = `refused: ${job.detail || response.status}`;
    return;
  }
  document.body.dataset.session = job.session_id;
  follow(job.session_id);
});
