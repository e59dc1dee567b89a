# Type stubs of the compiled module. The tensor API lives in _tensor_stubs.pyi until the
# merge folds it in here.

from cubepool._tensor_stubs import ALLOC_ALIGNMENT as ALLOC_ALIGNMENT
from cubepool._tensor_stubs import DEFAULT_WORKSPACE_ALIGNMENT as DEFAULT_WORKSPACE_ALIGNMENT
from cubepool._tensor_stubs import MAX_STACK_ALLOCA as MAX_STACK_ALLOCA
from cubepool._tensor_stubs import PARAM_DICT_MAGIC as PARAM_DICT_MAGIC
from cubepool._tensor_stubs import TEMP_ALLOCA_ALIGNMENT as TEMP_ALLOCA_ALIGNMENT
from cubepool._tensor_stubs import TENSOR_MAGIC as TENSOR_MAGIC
from cubepool._tensor_stubs import Device as Device
from cubepool._tensor_stubs import Tensor as Tensor
from cubepool._tensor_stubs import TensorMemoryPool as TensorMemoryPool
from cubepool._tensor_stubs import copy_from_bytes as copy_from_bytes
from cubepool._tensor_stubs import copy_from_to as copy_from_to
from cubepool._tensor_stubs import copy_to as copy_to
from cubepool._tensor_stubs import copy_to_bytes as copy_to_bytes
from cubepool._tensor_stubs import create_view as create_view
from cubepool._tensor_stubs import device_type_to_str as device_type_to_str
from cubepool._tensor_stubs import empty as empty
from cubepool._tensor_stubs import from_dlpack as from_dlpack
from cubepool._tensor_stubs import load_param_dict as load_param_dict
from cubepool._tensor_stubs import load_param_dict_from_file as load_param_dict_from_file
from cubepool._tensor_stubs import load_tensor as load_tensor
from cubepool._tensor_stubs import load_tensor_from_file as load_tensor_from_file
from cubepool._tensor_stubs import save_param_dict as save_param_dict
from cubepool._tensor_stubs import save_param_dict_to_file as save_param_dict_to_file
from cubepool._tensor_stubs import save_tensor as save_tensor
from cubepool._tensor_stubs import save_tensor_to_file as save_tensor_to_file

__version__: str
