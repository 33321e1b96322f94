"""`bsops fields [SECTION]`: every field an experiment may set, with its type, default, bounds and doc (fields.py)."""

from __future__ import annotations

import dataclasses
import json

import click

from bigscience_ops.cli.base import TEXT, main


@main.command("fields")
@click.argument("section", type=TEXT, required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the fields as a JSON list.")
@click.option("--markdown", is_flag=True, help="Print the fields as docs/FIELDS.md has them (a Markdown table).")
def fields_command(section: str | None, as_json: bool, markdown: bool) -> None:
    """List the experiment's fields (or SECTION's, such as `alerts` or `alerts.health`): each one's dotted path, type,
    default, bounds and what it is, read from the schema.

    A field is set in an experiment file (`train: {seed: 7}`), or for one command on its command line as
    `train.seed=7` (also spelled `--train.seed=7`)."""
    from bigscience_ops import fields

    if as_json and markdown:
        raise click.UsageError("--json and --markdown both given; allowed: one of them")
    rows = fields.fields(section)
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(r) for r in rows], indent=1))
    elif markdown:
        click.echo(fields.markdown(rows), nl=False)
    else:
        for r in rows:
            limits = f"  [{r.bounds}]" if r.bounds else ""
            settable = "" if r.settable else "  (not on the command line)"
            click.echo(f"{r.path}: {r.type} = {r.default}{limits}{settable}")
            if r.doc:
                click.echo(f"    {r.doc}")
