"""Reading inputs strictly and writing outputs safely; the bottom of the import order.

``output``: every file any command writes (checks before work starts; atomic for regular files,
in place for devices and FIFOs, through symlinks; never over an input or a folder). ``strict``:
YAML/JSON reading that refuses duplicate keys, and values echoed in messages kept short.
Imports nothing from the project; every other package may import it.
"""
