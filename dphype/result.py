"""The outcome of one DP-Hype selection, in the shape users know from Optuna's ``Study`` and Flower's ``Result``.

`DPHypeResult` holds the selected candidate (`DPHypeResult.best_params`), the released noisy vote
sum, the selection rule's estimate with the confidence in its pick (`dphype.selection.rules.Selection`),
the privacy report and (over SecAgg+) the secure sum's graph. `DPHypeResult.table` ranks every candidate,
`DPHypeResult.summary` prints it as text, `DPHypeResult.save` / `DPHypeResult.load` keep it as
JSON. Everything here is post-processing of the release: reading, ranking or saving it spends no privacy.

The winner-only release (``release="argmax"``, `dphype.privacy.winner`) publishes the index alone: its
result has ``noisy_sum`` and ``selection`` ``None`` (no votes, no estimate, no confidence), and its table
holds the winner only -- nothing released ranks the other candidates.

No Flower import here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dphype.privacy.accounting import PrivacyReport
from dphype.privacy.evaluation import EvaluationResult
from dphype.selection.candidates import Candidate, CandidateList
from dphype.selection.rules import Selection, selection_rule
from dphype.strict_json import jsonable

#: ``format`` of a saved result; `DPHypeResult.load` refuses other files.
RESULT_FORMAT = "dphype-result/1"
#: ``format`` of the record ``{"format": FAILURE_FORMAT, "error": "<type>: <message>"}`` a failed run writes where
#: its result would have gone, so no earlier result stays there; `DPHypeResult.load` refuses it.
FAILURE_FORMAT = "dphype-failure/1"


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """``rows`` as a plain-text table with a header line: right-aligned, floats to 4 digits, missing cells empty."""
    if columns is None:
        columns = list(dict.fromkeys(key for row in rows for key in row))

    def cell(value: Any) -> str:
        if value is None:
            return ""
        if isinstance(value, float) and not isinstance(value, bool):
            return f"{value:.4g}"
        return str(value)

    cells = [[cell(row.get(column)) for column in columns] for row in rows]
    widths = [max([len(str(column)), *(len(line[i]) for line in cells)]) for i, column in enumerate(columns)]
    lines = ["  ".join(str(c).rjust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in cells]
    return "\n".join(lines)


def format_fields(fields: Mapping[str, Any]) -> str:
    """Named values as text: ``key: value`` lines, a list of rows as a table, a mapping as ``a=1, b=2``."""

    def scalar(value: Any) -> str:
        value = jsonable(value)
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    lines = []
    for key, value in fields.items():
        if isinstance(value, list) and value and all(isinstance(row, dict) for row in value):
            table = format_table([{k: jsonable(v) for k, v in row.items()} for row in value])
            lines.append(f"{key}:\n" + "\n".join("  " + line for line in table.splitlines()))
        elif isinstance(value, dict):
            lines.append(f"{key}: " + ", ".join(f"{k}={scalar(v)}" for k, v in value.items()))
        elif isinstance(value, list) and key == "warnings":
            lines.extend(f"warning: {warning}" for warning in value)
        elif isinstance(value, list):
            lines.append(f"{key}: " + ", ".join(scalar(v) for v in value))
        else:
            lines.append(f"{key}: {scalar(value)}")
    return "\n".join(lines)


#: The fields of a run record (the bundled app's summary) that `summarize_run` shows after the selection, in order.
RUN_FIELDS = ("training", "run", "accuracy", "baseline", "reference", "test_loss", "selection_seconds",
              "fedavg_seconds", "seconds", "evaluation_error", "warnings")


def summarize_run(record: Mapping[str, Any]) -> str:
    """A run record as text: the selection's `DPHypeResult.summary`, then its `RUN_FIELDS`."""
    shown = {key: record[key] for key in RUN_FIELDS if key in record}
    fields = format_fields(shown)
    return DPHypeResult.from_dict(record).summary() + ("\n" + fields if fields else "")


@dataclass(frozen=True)
class DPHypeResult:
    """Outcome of one DP-Hype selection.

    Attributes:
        selected_index: The winner's index in ``candidates``.
        selected: The winner's hyperparameters.
        noisy_sum: The released noisy vote sum ``(p,)``, or ``None`` for a release without votes.
        report: The privacy report of the release.
        selection: The selection rule that ran, with its estimate and confidence; ``None`` for the winner-only release.
        candidates: The public candidate list.
        secure_sum: The secure sum's graph, failure bounds and clipping probability, when it ran over SecAgg+.
        notes: What else the operator should know (e.g. simulated nodes with per-run ledgers).
        federation: Which federation voted: ``"roster <fingerprint> (N members)"`` (authenticated by their roster,
            `dphype.secure.roster`) or ``"unauthenticated"``; ``None`` where no pre-flight ran.
        folder: The run folder that keeps this run's record, model and log (`dphype.runs.RunFolder`); ``None``
            where the run keeps none.
        evaluation: The private evaluation of the final model trained with the pick (its held-out accuracy and the
            majority-class baseline, with their noise and privacy cost, `dphype.privacy.evaluation.EvaluationResult`);
            ``None`` where none ran.
        plan: The planner's advice the server logged once before the vote (``"advice"``, one line) with its details
            (`dphype.selection.plan_result.Plan.to_dict`); ``None`` where no planner ran.
    """

    selected_index: int
    selected: Candidate
    noisy_sum: np.ndarray | None
    report: PrivacyReport
    selection: Selection | None
    candidates: CandidateList
    secure_sum: dict[str, Any] | None = None
    notes: tuple[str, ...] = ()
    federation: str | None = None
    folder: str | None = None
    evaluation: EvaluationResult | None = None
    plan: dict[str, Any] | None = None

    @property
    def best_params(self) -> Candidate:
        """The selected candidate's hyperparameters (Optuna's ``study.best_params``)."""
        return dict(self.selected)

    def table(self, top: int | None = None) -> list[dict[str, Any]]:
        """Every candidate (or the ``top`` first), ranked by the selection rule's estimate of the vote sum.

        Ties go by index; the pick leads the table.

        Args:
            top: How many rows to return; all when ``None``.

        Returns:
            One row per candidate: ``rank``, ``index``, its hyperparameters, ``votes`` (where the release has them) and
            ``estimate``; only the winner's row for a release without votes.
        """
        if self.selection is None:  # the winner-only release ranks nothing else
            return [{"rank": 1, "index": self.selected_index, **self.selected}]
        estimate = np.asarray(self.selection.estimate, dtype=np.float64)
        order = sorted(range(len(self.candidates)), key=lambda i: (-estimate[i], i))
        if order and order[0] != self.selected_index:  # the pick leads its own table
            order.remove(self.selected_index)
            order.insert(0, self.selected_index)
        rows = []
        for rank, i in enumerate(order[:top] if top is not None else order, start=1):
            row: dict[str, Any] = {"rank": rank, "index": i, **self.candidates[i]}
            if self.noisy_sum is not None:
                row["votes"] = float(self.noisy_sum[i])
            if selection_rule(self.selection.rule).models or self.noisy_sum is None:
                row["estimate"] = float(estimate[i])
            rows.append(row)
        return rows

    def summary(self, top: int = 10) -> str:
        """Readable text: the pick, the rule and its confidence, the guarantee and the ``top`` rows of `table`."""
        sel, rep = self.selection, self.report
        params = ", ".join(f"{key}={value}" for key, value in self.selected.items())
        contributed = "" if rep.survivors is None else f", {rep.survivors} of {rep.clients} clients contributed"
        lines = [f"DP-Hype selected candidate {self.selected_index} of {len(self.candidates)}: {params}"]
        if sel is None:
            lines.append("rule: secure argmax (report-noisy-max); only the winner's index was released, so there "
                         "is no confidence and no ranking of the others")
        else:
            rule = sel.rule if sel.rule == sel.requested else f"{sel.rule} (asked for {sel.requested}: {sel.fallback})"
            lines.append(f"rule: {rule}; confidence: P(top-voted) {sel.p_top:.2f}, P(within {sel.tolerance:g} votes "
                         f"of the top) {sel.p_top_group:.2f}, margin {sel.margin:.2f} sigma")
        accountant = rep.accountant if rep.release_delta is not None else f"{rep.accountant} accountant"
        lines.append(f"privacy: {rep.guarantee()} per client ({rep.neighbouring}, {accountant}), {rep.noise} noise "
                     f"sigma={rep.sigma:.4g}{contributed}; released: {rep.released}")
        lines.append(f"ballots: {rep.ballots()}")
        if sel is not None and sel.warning:
            lines.append(f"warning: {sel.warning}")
        if self.federation is not None:
            lines.append(f"federation: {self.federation}")
        lines.extend(f"note: {note}" for note in self.notes)
        if self.folder is not None:
            lines.append(f"run folder: {self.folder} (result.json, model.npz, log.txt)")
        if sel is not None:
            shown = min(top, len(self.candidates))
            lines.append(f"top {shown} of {len(self.candidates)} candidates, ranked by the {sel.rule} rule's estimate:")
        lines.append(format_table(self.table(top)))
        if self.evaluation is not None:  # last: how good the pick turned out, and a pick below the baseline says so
            lines.append(self.evaluation.describe())
            verdict = self.evaluation.verdict()
            if verdict is not None:
                lines.append(f"warning: {verdict}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly record of everything, format `RESULT_FORMAT` (`from_dict` reads it back)."""
        out: dict[str, Any] = {
            "format": RESULT_FORMAT,
            "selected_index": self.selected_index,
            "best_params": self.best_params,
            "noisy_sum": None if self.noisy_sum is None else self.noisy_sum.tolist(),
            "privacy": self.report.to_dict(),
            "confidence": None if self.selection is None else self.selection.to_dict(),
            "estimate": None if self.selection is None else np.asarray(self.selection.estimate, np.float64).tolist(),
            "candidates": json.loads(self.candidates.to_json()),
        }
        if self.secure_sum is not None:
            out["secure_sum"] = dict(self.secure_sum)
        if self.notes:
            out["notes"] = list(self.notes)
        if self.federation is not None:
            out["federation"] = self.federation
        if self.folder is not None:
            out["folder"] = self.folder
        if self.evaluation is not None:
            out["evaluation"] = self.evaluation.to_dict()
        if self.plan is not None:
            out["plan"] = dict(self.plan)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DPHypeResult:
        """Rebuild a result from `to_dict`'s record.

        Args:
            data: The record (``noisy_sum``, ``confidence`` and ``estimate`` may be left out where ``None``).

        Returns:
            The result.

        Raises:
            ValueError: For another format, an incomplete record, or a selected candidate that is not the list's
                entry at its index.
        """
        if data.get("format") != RESULT_FORMAT:
            raise ValueError(f"format must be {RESULT_FORMAT!r}, got {data.get('format')!r}")
        try:
            candidates = CandidateList.from_json(json.dumps(data["candidates"]))
            conf = data.get("confidence")  # absent or None: a release without votes
            selection = None if conf is None else Selection(
                index=int(conf["selected"]), rule=conf["rule"], requested=conf["requested_rule"],
                fallback=conf["fallback"], estimate=np.asarray(data["estimate"], dtype=np.float64),
                sigma=float(conf["sigma"]), p_top=float(conf["p_top"]), p_top_group=float(conf["p_top_group"]),
                tolerance=float(conf["tolerance_votes"]), margin=float(conf["margin_sigma"]), warning=conf["warning"])
            noisy = data.get("noisy_sum")
            result = cls(selected_index=int(data["selected_index"]), selected=dict(data["best_params"]),
                         noisy_sum=None if noisy is None else np.asarray(noisy, dtype=np.float64),
                         report=PrivacyReport(**data["privacy"]), selection=selection, candidates=candidates,
                         secure_sum=data.get("secure_sum"), notes=tuple(data.get("notes", ())),
                         federation=data.get("federation"), folder=data.get("folder"), plan=data.get("plan"),
                         evaluation=None if data.get("evaluation") is None else
                         EvaluationResult.from_dict(data["evaluation"]))
        except (KeyError, TypeError) as err:
            raise ValueError(f"the result record is incomplete: {err}") from None
        if candidates[result.selected_index] != result.selected:
            raise ValueError("best_params must be the candidate at selected_index")
        return result

    def save(self, path: str | Path) -> Path:
        """Write `to_dict` as JSON to ``path`` and return it (Python's JSON: an infinite epsilon is ``Infinity``)."""
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path) -> DPHypeResult:
        """Read a result written by `save`; a file without a record of this format is refused."""
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))
