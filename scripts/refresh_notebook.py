"""Execute examples/quickstart.ipynb (from the repository root:
``.venv/bin/python scripts/refresh_notebook.py``) with its defaults and keep its outputs, each stream
collapsed as a terminal shows it (a progress bar's redraws become its last state)."""
import nbformat
from nbclient import NotebookClient

def terminal(text: str) -> str:
    return "\n".join(line.rsplit("\r", 1)[-1] if "\r" in line.rstrip("\r") else line.rstrip("\r") for line in text.split("\n"))

nb = nbformat.read("examples/quickstart.ipynb", as_version=4)
NotebookClient(nb, timeout=1200, kernel_name="python3", resources={"metadata": {"path": "examples"}}).execute()
for c in nb.cells:
    if c.cell_type != "code":
        continue
    merged = []
    for o in c.outputs:
        if o.output_type == "stream" and merged and merged[-1].output_type == "stream" and merged[-1].name == o.name:
            merged[-1].text += o.text
        else:
            merged.append(o)
    for o in merged:
        if o.output_type == "stream":
            o.text = terminal(o.text)
    c.outputs = merged
nbformat.write(nb, "examples/quickstart.ipynb")
