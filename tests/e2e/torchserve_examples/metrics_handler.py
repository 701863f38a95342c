"""Stand-in for TorchServe's custom_metrics example handler (MNIST with handler metrics)."""

import time

from torchvision import transforms
from ts.metrics.dimension import Dimension
from ts.metrics.metric_type_enum import MetricTypes
from ts.torch_handler.image_classifier import ImageClassifier


class MNISTDigitClassifier(ImageClassifier):
    image_processing = transforms.Compose(
        [transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))]
    )

    def initialize(self, context):
        super().initialize(context)
        metrics = context.metrics
        self.inf_request_count = metrics.add_metric_to_cache(
            metric_name="InferenceRequestCount",
            unit="count",
            dimension_names=[],
            metric_type=MetricTypes.COUNTER,
        )
        metrics.add_metric_to_cache(
            metric_name="PreprocessCallCount",
            unit="count",
            dimension_names=["ModelName"],
            metric_type=MetricTypes.COUNTER,
        )
        metrics.add_metric(
            name="InitializeCallCount", value=1, unit="count", metric_type=MetricTypes.COUNTER
        )

    def preprocess(self, data):
        start = time.time()
        metrics = self.context.metrics
        self.inf_request_count.add_or_update(value=1, dimension_values=[])
        metrics.get_metric(
            metric_name="PreprocessCallCount", metric_type=MetricTypes.COUNTER
        ).add_or_update(value=1, dimension_values=[self.context.model_name])
        # Declared only in metrics.yaml: this is what fails when metrics_config is ignored.
        metrics.get_metric(
            metric_name="RequestBatchSize", metric_type=MetricTypes.GAUGE
        ).add_or_update(value=len(data), dimension_values=[self.context.model_name])
        metrics.add_size(name="SizeOfImage", value=len(data[0].get("body")) / 1024, unit="kB")
        images = ImageClassifier.preprocess(self, data)
        metrics.add_time(
            name="HandlerMethodTime",
            value=(time.time() - start) * 1000,
            unit="ms",
            dimensions=[Dimension(name="MethodName", value="preprocess")],
            metric_type=MetricTypes.GAUGE,
        )
        return images

    def postprocess(self, data):
        self.context.metrics.add_counter(name="PostprocessCallCount", value=1, dimensions=[])
        self.context.metrics.add_percent(
            name="ExamplePercentMetric", value=50, dimensions=[], metric_type=MetricTypes.HISTOGRAM
        )
        return data.argmax(1).flatten().tolist()
