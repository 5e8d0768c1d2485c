from polytrain.cli import run

run()
