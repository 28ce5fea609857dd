"""No inputs or outputs in config.pbtxt: auto_complete_config declares them (A + B -> SUM, FP32 [2], max_batch_size 4)."""
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        for name in ("A", "B"):
            auto_complete_model_config.add_input({"name": name, "data_type": "TYPE_FP32", "dims": [2]})
        auto_complete_model_config.add_output({"name": "SUM", "data_type": "TYPE_FP32", "dims": [2]})
        auto_complete_model_config.set_max_batch_size(4)
        return auto_complete_model_config

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("SUM", pb_utils.get_input_tensor_by_name(r, "A").as_numpy()
                                                            + pb_utils.get_input_tensor_by_name(r, "B").as_numpy())])
                for r in requests]
