"""A branch that takes a known time: sleeps ``handler.seconds`` then names itself."""

import time


class Sleeper:
    def initialize(self, context):
        self.seconds = float(context.model_yaml_config["handler"]["seconds"])
        self.name = context.model_yaml_config["handler"]["name"]

    def handle(self, data, context):
        if data is None:
            return None
        time.sleep(self.seconds)
        return [{"branch": self.name, "got": (row.get("body") or b"").decode()} for row in data]
