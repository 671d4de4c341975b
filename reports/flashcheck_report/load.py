"""Reading records: the *.jsonl files under the paths given, each line checked
against docs/record.schema.json, schema-1 verdicts brought up to date, and the
small readers of a record's fields (problem line, numbers, errors, histogram
edges) that aggregate.py and the plots share."""
import collections
import json
import math
import os

SCHEMA = 4  # core/record.hpp kRecordSchema
# Schema 1 lacks the verdicts `vacuous` and `deviation`: its passes that compared
# no row are read as vacuous (normalise_verdict). Schemas 1 and 2 lack
# `rows_basis` (every or sampled rows) and `every_row_unavailable`. Schemas 1
# to 3 lack `histogram_edges`: their histograms have the bins of
# LEGACY_HISTOGRAM_EDGES. From schema 4 on, each judged case carries its edges.
READABLE_SCHEMAS = (1, 2, 3, 4, 5)
LEGACY_HISTOGRAM_EDGES = dict(log10=[0.0, 0.0] + [10.0 ** (i - 16) for i in range(21)] + [math.inf],
                              ulp_log2=[0.0, 0.0] + [2.0 ** (i - 8) for i in range(29)] + [math.inf])

SCHEMA_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "record.schema.json")


class BadInput(Exception):
    """Input the report cannot read: one line for the user, exit 2."""


def record_files(paths):
    files = []
    for path in paths:
        if os.path.isdir(path):
            for root, _, names in sorted(os.walk(path)):
                files += [os.path.join(root, n) for n in sorted(names) if n.endswith(".jsonl")]
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise BadInput(f"{path}: no such file or folder")
    return files


def record_validator(warnings):
    """The validator of docs/record.schema.json, or None (with a warning)
    where this Python has no jsonschema (Debian: python3-jsonschema)."""
    try:
        import jsonschema
    except ImportError:
        warnings.append("records not validated against docs/record.schema.json: this Python has no jsonschema "
                        "(Debian: apt install python3-jsonschema)")
        return None
    try:
        with open(SCHEMA_FILE, encoding="utf-8") as f:
            schema = json.load(f)
    except OSError as error:
        warnings.append(f"records not validated: cannot read {SCHEMA_FILE} ({error.strerror})")
        return None
    return jsonschema.Draft202012Validator(schema)


def schema_problem(validator, record):
    """Why `record` does not follow the schema (one line), or None."""
    if validator is None:
        return None
    import jsonschema
    error = jsonschema.exceptions.best_match(validator.iter_errors(record))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "the record"
    return f"{where}: {error.message[:200]}"


def read_records(paths, warnings):
    """Every record under `paths`; a torn last line (a killed run), unreadable
    lines and records that do not follow docs/record.schema.json are reported
    in `warnings` and skipped."""
    validator = record_validator(warnings)
    files = record_files(paths)
    if not files:
        raise BadInput(f"no records: no *.jsonl file under {', '.join(paths)} (write them with flashcheck run "
                       "--record, fuzz --out or bench --record)")
    records, schemas = [], collections.Counter()
    for path in files:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError as error:
            raise BadInput(f"{path}: cannot read it ({error.strerror})")
        lines = text.split("\n")
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                last = number == len(lines) or (number == len(lines) - 1 and lines[-1] == "")
                if last and not text.endswith("\n"):
                    warnings.append(f"{path}: the last line is truncated (a killed run?); it was skipped")
                else:
                    warnings.append(f"{path}:{number}: not a JSON record; skipped")
                continue
            if not isinstance(record, dict):
                warnings.append(f"{path}:{number}: not a JSON object; skipped")
                continue
            schema = record.get("schema", None)
            schemas[schema] += 1
            if schema not in READABLE_SCHEMAS:
                raise BadInput(f"{path}:{number}: a record of schema {schema}; this report reads schema "
                               f"{' or '.join(map(str, READABLE_SCHEMAS))} "
                               "(records from another flashcheck version: re-run them, or report them with "
                               "that version)")
            problem = schema_problem(validator, record)
            if problem:
                warnings.append(f"{path}:{number}: does not follow docs/record.schema.json ({problem}); skipped")
                continue
            record["_file"] = path
            normalise_verdict(record)
            records.append(record)
    if not records:
        raise BadInput(f"no records: the *.jsonl files under {', '.join(paths)} hold none")
    return records


def normalise_verdict(record):
    """A schema-1 pass that compared no row (rows_compared 0), or no element of
    O (no finite pair and no NaN/Inf position), was vacuous: schema 1 wrote it
    as a pass. (Its fully masked rows counted as compared: schema 2 says
    rows_visible.)"""
    if record.get("schema") == 1 and record.get("verdict") == "pass":
        metrics = record.get("metrics") or {}
        o = metrics.get("o") or {}
        count = (o.get("errors") or {}).get("count")
        census = o.get("census") or {}
        nonfinite = sum(census.get(k, 0) for k in ("got_nan", "got_pos_inf", "got_neg_inf", "want_nan",
                                                   "want_pos_inf", "want_neg_inf"))
        if metrics.get("rows_compared") == 0 or (count == 0 and nonfinite == 0):
            record["verdict"] = "vacuous"


# ---- a record's fields ---------------------------------------------------------------------------


def problem_fields(line):
    fields = {}
    for token in (line or "").split():
        if "=" in token:
            key, value = token.split("=", 1)
            fields[key] = value
    return fields


def kind_of(record):
    return record.get("kind") or ("case" if "verdict" in record else "other")


GRADIENTS = ("dQ", "dK", "dV")


def tensors_of(record):
    """What a case compared: O for a forward case; dQ, dK and dV for a
    backward one (schema 5: a problem with pass=bwd writes `gradients`)."""
    return GRADIENTS if "gradients" in record else ("O",)


def errors_of(record, where="metrics", tensor="o"):
    """The error statistics of one tensor ("o", "lse"; "dQ", "dK", "dV" of a
    backward case) of the subject (where="metrics"), the baseline or the peer."""
    try:
        if tensor in GRADIENTS:
            holder = record if where == "metrics" else record[where]
            return holder["gradients"][tensor.lower()]["errors"]
        tensor = tensor.lower()
        return record[where]["metrics"][tensor]["errors"] if where != "metrics" else record["metrics"][tensor]["errors"]
    except (KeyError, TypeError):
        return None


def histogram_edges(record):
    """The edges of a case's histograms (histogram_log10, histogram_ulp_log2 of
    every tensor in it), bins + 1 each: dict(log10=..., ulp_log2=...). The
    record's own (schema 4 on), else the bins schemas 1 to 3 were written with."""
    edges = record.get("histogram_edges")
    if not isinstance(edges, dict):
        return LEGACY_HISTOGRAM_EDGES
    return {key: [num(x, math.nan) for x in edges.get(key) or []] for key in ("log10", "ulp_log2")}


def bin_labels(edges, kind):
    """A label per bin, from its edges: "0", "<1e-16", "1e-16", ..., ">=1e4"."""
    def power(x):
        return f"1e{round(math.log10(x))}" if kind == "abs" else f"2^{round(math.log2(x))}"
    labels = []
    for low, high in zip(edges, edges[1:]):
        if high == 0:
            labels.append("0")
        elif low == 0:
            labels.append(f"<{power(high)}")
        elif math.isinf(high):
            labels.append(f">={power(low)}")
        else:
            labels.append(power(low))
    return labels


def num(value, default=0.0):
    """A record's number: core/record.cpp writes NaN and infinities as strings."""
    if value is None:
        return default
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return default
    return float(value)
