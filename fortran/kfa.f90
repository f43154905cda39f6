!> kfa for Fortran (iso_c_binding over include/kfa/c_api.h; guide:
!> docs/c_fortran.md).
!>
!> Two layers:
!>  - kfa_c_* : the C functions as they are (type(c_ptr) data, 0-based
!>    indices, no fence), for device memory, 16-bit types and streams;
!>  - kfa_*   : wrappers on Fortran arrays of real(c_float) or
!>    real(c_double) in host memory, with optional arguments, 1-based
!>    parameter indices, and a fence before they return, so the results are
!>    in the arrays.
!> Fortran arrays are column-major: a C tensor [batch][seqlen][d_model] is
!> the Fortran array x(d_model, seqlen, batch). Every function returns a
!> status (KFA_SUCCESS = 0); kfa_last_error() says what went wrong.
module kfa
  use, intrinsic :: iso_c_binding
  implicit none
  private

  ! kfa_status
  integer(c_int), parameter, public :: KFA_SUCCESS = 0, KFA_ERROR_INVALID_ARGUMENT = 1, &
    KFA_ERROR_UNSUPPORTED = 2, KFA_ERROR_NOT_INITIALIZED = 3, KFA_ERROR_INVALID_STATE = 4, &
    KFA_ERROR_INTERNAL = 5
  ! kfa_dtype, kfa_space
  integer(c_int), parameter, public :: KFA_F64 = 0, KFA_F32 = 1, KFA_BF16 = 2, KFA_F16 = 3
  integer(c_int), parameter, public :: KFA_SPACE_DEFAULT = 0, KFA_SPACE_HOST = 1
  ! kfa_norm, kfa_activation, kfa_rotary_style
  integer(c_int32_t), parameter, public :: KFA_LAYER_NORM = 0, KFA_RMS_NORM = 1
  integer(c_int32_t), parameter, public :: KFA_GELU = 0, KFA_GELU_TANH = 1, KFA_SWIGLU = 2
  integer(c_int32_t), parameter, public :: KFA_ROTARY_HALF_SPLIT = 0, KFA_ROTARY_INTERLEAVED = 1
  ! kfa_gradient_reduction
  integer(c_int32_t), parameter, public :: KFA_GRADIENT_MEAN = 0, KFA_GRADIENT_SUM = 1

  !> kfa_attention_options (booleans are 0 or 1).
  type, bind(c), public :: kfa_attention_options
    real(c_double) :: softmax_scale
    integer(c_int32_t) :: causal, deterministic, window_left, window_right
    real(c_double) :: softcap, dropout_p
    integer(c_int64_t) :: dropout_seed
  end type

  !> kfa_block_options.
  type, bind(c), public :: kfa_block_options
    integer(c_int32_t) :: d_model, heads, kv_heads, head_dim, d_ff, norm, activation
    integer(c_int32_t) :: bias, fused_qkv, rotary, rotary_style, rotary_dim
    integer(c_int32_t) :: rotary_position_offset, reserved
    real(c_double) :: rotary_base, norm_eps, dropout_p
    integer(c_int64_t) :: init_seed
    type(kfa_attention_options) :: attention
  end type

  !> kfa_adamw_options.
  type, bind(c), public :: kfa_adamw_options
    real(c_double) :: lr, beta1, beta2, eps, weight_decay
  end type

  !> A TransformerBlock: the C handle and what the wrappers need to know.
  type, public :: kfa_block
    type(c_ptr) :: handle = c_null_ptr
    integer(c_int) :: dtype = KFA_F32
    integer(c_int) :: space = KFA_SPACE_HOST
    integer(c_int64_t) :: d_model = 0
  end type

  ! The message of a check made on the Fortran side (the shapes the arrays
  ! carry); kfa_last_error prefers it while set. Each wrapper clears it.
  character(len=:), allocatable :: fortran_error

  public :: kfa_last_error, kfa_initialize, kfa_finalize, kfa_fence
  public :: kfa_attention_options_default, kfa_block_options_default, kfa_adamw_options_default
  public :: kfa_attention_forward, kfa_attention_backward
  public :: kfa_block_create, kfa_block_destroy, kfa_block_forward, kfa_block_backward
  public :: kfa_block_zero_grad, kfa_block_adamw_step
  public :: kfa_block_create_sequence_parallel, kfa_block_allreduce_gradients
  public :: kfa_block_parameter_count, kfa_block_parameter_name, kfa_block_parameter
  public :: kfa_c_last_error, kfa_c_initialize, kfa_c_finalize, kfa_c_fence
  public :: kfa_c_attention_forward, kfa_c_attention_backward
  public :: kfa_c_block_create, kfa_c_block_destroy, kfa_c_block_forward, kfa_c_block_backward
  public :: kfa_c_block_zero_grad, kfa_c_block_adamw_step
  public :: kfa_c_block_create_sequence_parallel, kfa_c_block_allreduce_gradients
  public :: kfa_c_block_parameter_count, kfa_c_block_parameter_name, kfa_c_block_parameter

  interface
    function kfa_c_last_error() bind(c, name="kfa_last_error") result(message)
      import :: c_ptr
      type(c_ptr) :: message
    end function
    function kfa_c_initialize() bind(c, name="kfa_initialize") result(status)
      import :: c_int
      integer(c_int) :: status
    end function
    function kfa_c_finalize() bind(c, name="kfa_finalize") result(status)
      import :: c_int
      integer(c_int) :: status
    end function
    function kfa_c_fence(space, stream) bind(c, name="kfa_fence") result(status)
      import :: c_int, c_ptr
      integer(c_int), value :: space
      type(c_ptr), value :: stream
      integer(c_int) :: status
    end function
    subroutine kfa_c_attention_options_default(options) &
        bind(c, name="kfa_attention_options_default")
      import :: kfa_attention_options
      type(kfa_attention_options), intent(out) :: options
    end subroutine
    subroutine kfa_c_block_options_default(options) bind(c, name="kfa_block_options_default")
      import :: kfa_block_options
      type(kfa_block_options), intent(out) :: options
    end subroutine
    subroutine kfa_c_adamw_options_default(options) bind(c, name="kfa_adamw_options_default")
      import :: kfa_adamw_options
      type(kfa_adamw_options), intent(out) :: options
    end subroutine
    !> options: c_loc of a kfa_attention_options, or c_null_ptr for the defaults.
    function kfa_c_attention_forward(space, stream, dtype, q, k, v, o, lse, batch, seqlen_q, &
        seqlen_k, heads, kv_heads, head_dim, options) &
        bind(c, name="kfa_attention_forward") result(status)
      import :: c_int, c_ptr, c_int64_t
      integer(c_int), value :: space, dtype
      type(c_ptr), value :: stream, q, k, v, o, lse, options
      integer(c_int64_t), value :: batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim
      integer(c_int) :: status
    end function
    function kfa_c_attention_backward(space, stream, dtype, q, k, v, o, lse, d_o, dq, dk, dv, &
        batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim, options) &
        bind(c, name="kfa_attention_backward") result(status)
      import :: c_int, c_ptr, c_int64_t
      integer(c_int), value :: space, dtype
      type(c_ptr), value :: stream, q, k, v, o, lse, d_o, dq, dk, dv, options
      integer(c_int64_t), value :: batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim
      integer(c_int) :: status
    end function
    function kfa_c_block_create(options, dtype, space, block) &
        bind(c, name="kfa_block_create") result(status)
      import :: c_int, c_ptr, kfa_block_options
      type(kfa_block_options), intent(in) :: options
      integer(c_int), value :: dtype, space
      type(c_ptr), intent(out) :: block
      integer(c_int) :: status
    end function
    !> comm: an MPI communicator's Fortran handle (MPI_COMM_WORLD of `use
    !> mpi`, comm%MPI_VAL of `use mpi_f08`).
    function kfa_c_block_create_sequence_parallel(options, dtype, space, comm, block) &
        bind(c, name="kfa_block_create_sequence_parallel") result(status)
      import :: c_int, c_int32_t, c_ptr, kfa_block_options
      type(kfa_block_options), intent(in) :: options
      integer(c_int), value :: dtype, space
      integer(c_int32_t), value :: comm
      type(c_ptr), intent(out) :: block
      integer(c_int) :: status
    end function
    function kfa_c_block_allreduce_gradients(block, stream, comm, reduction, deterministic) &
        bind(c, name="kfa_block_allreduce_gradients") result(status)
      import :: c_int, c_int32_t, c_ptr
      type(c_ptr), value :: block, stream
      integer(c_int32_t), value :: comm, reduction, deterministic
      integer(c_int) :: status
    end function
    function kfa_c_block_destroy(block) bind(c, name="kfa_block_destroy") result(status)
      import :: c_int, c_ptr
      type(c_ptr), value :: block
      integer(c_int) :: status
    end function
    function kfa_c_block_forward(block, stream, dtype, x, y, batch, seqlen, d_model, &
        dropout_seed, training) bind(c, name="kfa_block_forward") result(status)
      import :: c_int, c_ptr, c_int64_t, c_int32_t
      type(c_ptr), value :: block, stream, x, y
      integer(c_int), value :: dtype
      integer(c_int64_t), value :: batch, seqlen, d_model, dropout_seed
      integer(c_int32_t), value :: training
      integer(c_int) :: status
    end function
    function kfa_c_block_backward(block, stream, dtype, dy, dx, batch, seqlen, d_model) &
        bind(c, name="kfa_block_backward") result(status)
      import :: c_int, c_ptr, c_int64_t
      type(c_ptr), value :: block, stream, dy, dx
      integer(c_int), value :: dtype
      integer(c_int64_t), value :: batch, seqlen, d_model
      integer(c_int) :: status
    end function
    function kfa_c_block_zero_grad(block, stream) bind(c, name="kfa_block_zero_grad") &
        result(status)
      import :: c_int, c_ptr
      type(c_ptr), value :: block, stream
      integer(c_int) :: status
    end function
    !> options: c_loc of a kfa_adamw_options, or c_null_ptr for the defaults.
    function kfa_c_block_adamw_step(block, stream, options) &
        bind(c, name="kfa_block_adamw_step") result(status)
      import :: c_int, c_ptr
      type(c_ptr), value :: block, stream, options
      integer(c_int) :: status
    end function
    function kfa_c_block_parameter_count(block, count) &
        bind(c, name="kfa_block_parameter_count") result(status)
      import :: c_int, c_ptr, c_int32_t
      type(c_ptr), value :: block
      integer(c_int32_t), intent(out) :: count
      integer(c_int) :: status
    end function
    !> index is 0-based here.
    function kfa_c_block_parameter_name(block, index, name) &
        bind(c, name="kfa_block_parameter_name") result(status)
      import :: c_int, c_ptr, c_int32_t
      type(c_ptr), value :: block
      integer(c_int32_t), value :: index
      type(c_ptr), intent(out) :: name
      integer(c_int) :: status
    end function
    !> name: a NUL-terminated string (trim(name)//c_null_char).
    function kfa_c_block_parameter(block, name, value, grad, size) &
        bind(c, name="kfa_block_parameter") result(status)
      import :: c_int, c_ptr, c_char, c_int64_t
      type(c_ptr), value :: block
      character(kind=c_char), dimension(*), intent(in) :: name
      type(c_ptr), intent(out) :: value, grad
      integer(c_int64_t), intent(out) :: size
      integer(c_int) :: status
    end function
    function c_strlen(s) bind(c, name="strlen") result(n)
      import :: c_ptr, c_size_t
      type(c_ptr), value :: s
      integer(c_size_t) :: n
    end function
  end interface

  !> Attention on host arrays: q, o, d_o, dq (head_dim, heads, seqlen_q, batch),
  !> k, v, dk, dv (head_dim, kv_heads, seqlen_k, batch), lse (seqlen_q, heads,
  !> batch) of the same kind as q.
  interface kfa_attention_forward
    module procedure attention_forward_f32, attention_forward_f64
  end interface
  interface kfa_attention_backward
    module procedure attention_backward_f32, attention_backward_f64
  end interface
  !> x, y, dy, dx (d_model, seqlen, batch) of the block's kind.
  interface kfa_block_forward
    module procedure block_forward_f32, block_forward_f64
  end interface
  interface kfa_block_backward
    module procedure block_backward_f32, block_backward_f64
  end interface
  !> A parameter as type(c_ptr) (any space) or as Fortran pointers to
  !> its values and gradient (a host block of that kind).
  interface kfa_block_parameter
    module procedure block_parameter_ptr, block_parameter_f32, block_parameter_f64
  end interface

contains

  function c_string(p) result(s)
    type(c_ptr), intent(in) :: p
    character(len=:), allocatable :: s
    character(kind=c_char), pointer :: chars(:)
    integer :: n, i
    if (.not. c_associated(p)) then
      s = ''
      return
    end if
    n = int(c_strlen(p))
    call c_f_pointer(p, chars, [n])
    allocate(character(len=n) :: s)
    do i = 1, n
      s(i:i) = chars(i)
    end do
  end function

  subroutine clear_fortran_error()
    fortran_error = ''
  end subroutine

  ! Sets the Fortran-side message: `name` must have shape `expected`.
  integer(c_int) function shape_error(function, name, expected, got) result(status)
    character(len=*), intent(in) :: function, name
    integer, intent(in) :: expected(:), got(:)
    character(len=256) :: e, g
    write(e, '(*(i0, :, ","))') expected
    write(g, '(*(i0, :, ","))') got
    fortran_error = function // ': ' // name // ' must have the shape (' // trim(e) // &
                    '), got (' // trim(g) // ')'
    status = KFA_ERROR_INVALID_ARGUMENT
  end function

  function stream_or_null(stream) result(p)
    type(c_ptr), intent(in), optional :: stream
    type(c_ptr) :: p
    p = c_null_ptr
    if (present(stream)) p = stream
  end function

  !> The message of the last failed call on this thread.
  function kfa_last_error() result(message)
    character(len=:), allocatable :: message
    if (allocated(fortran_error)) then
      if (len(fortran_error) > 0) then
        message = fortran_error
        return
      end if
    end if
    message = c_string(kfa_c_last_error())
  end function

  integer(c_int) function kfa_initialize() result(status)
    call clear_fortran_error()
    status = kfa_c_initialize()
  end function

  integer(c_int) function kfa_finalize() result(status)
    call clear_fortran_error()
    status = kfa_c_finalize()
  end function

  !> Waits for the work enqueued on `stream` (default: the default instance).
  integer(c_int) function kfa_fence(space, stream) result(status)
    integer(c_int), intent(in) :: space
    type(c_ptr), intent(in), optional :: stream
    call clear_fortran_error()
    status = kfa_c_fence(space, stream_or_null(stream))
  end function

  function kfa_attention_options_default() result(options)
    type(kfa_attention_options) :: options
    call kfa_c_attention_options_default(options)
  end function

  function kfa_block_options_default() result(options)
    type(kfa_block_options) :: options
    call kfa_c_block_options_default(options)
  end function

  function kfa_adamw_options_default() result(options)
    type(kfa_adamw_options) :: options
    call kfa_c_adamw_options_default(options)
  end function

  ! ---------------------------------------------------------------- attention

  integer(c_int) function attention_forward_f32(q, k, v, o, lse, options) result(status)
    real(c_float), intent(in), target, contiguous :: q(:,:,:,:), k(:,:,:,:), v(:,:,:,:)
    real(c_float), intent(inout), target, contiguous :: o(:,:,:,:), lse(:,:,:)
    type(kfa_attention_options), intent(in), optional :: options
    call clear_fortran_error()
    status = check_attention('kfa_attention_forward', shape(q), shape(k), shape(v), shape(o), &
                             shape(lse))
    if (status /= KFA_SUCCESS) return
    status = attention_forward(KFA_F32, c_loc(q), c_loc(k), c_loc(v), c_loc(o), c_loc(lse), &
                               shape(q), shape(k), options)
  end function

  integer(c_int) function attention_forward_f64(q, k, v, o, lse, options) result(status)
    real(c_double), intent(in), target, contiguous :: q(:,:,:,:), k(:,:,:,:), v(:,:,:,:)
    real(c_double), intent(inout), target, contiguous :: o(:,:,:,:), lse(:,:,:)
    type(kfa_attention_options), intent(in), optional :: options
    call clear_fortran_error()
    status = check_attention('kfa_attention_forward', shape(q), shape(k), shape(v), shape(o), &
                             shape(lse))
    if (status /= KFA_SUCCESS) return
    status = attention_forward(KFA_F64, c_loc(q), c_loc(k), c_loc(v), c_loc(o), c_loc(lse), &
                               shape(q), shape(k), options)
  end function

  ! The extents C cannot see: every array against q's and k's.
  integer(c_int) function check_attention(function, q, k, v, o, lse, d_o, dq, dk, dv) &
      result(status)
    character(len=*), intent(in) :: function
    integer, intent(in) :: q(4), k(4), v(4), o(4), lse(3)
    integer, intent(in), optional :: d_o(4), dq(4), dk(4), dv(4)
    status = KFA_SUCCESS
    if (k(1) /= q(1) .or. k(4) /= q(4)) then
      status = shape_error(function, 'k (head_dim, kv_heads, seqlen_k, batch)', &
                           [q(1), k(2), k(3), q(4)], k)
    else if (any(v /= k)) then
      status = shape_error(function, 'v (head_dim, kv_heads, seqlen_k, batch)', k, v)
    else if (any(o /= q)) then
      status = shape_error(function, 'o (head_dim, heads, seqlen_q, batch)', q, o)
    else if (any(lse /= [q(3), q(2), q(4)])) then
      status = shape_error(function, 'lse (seqlen_q, heads, batch)', [q(3), q(2), q(4)], lse)
    end if
    if (status /= KFA_SUCCESS .or. .not. present(d_o)) return
    if (any(d_o /= q)) then
      status = shape_error(function, 'd_o (head_dim, heads, seqlen_q, batch)', q, d_o)
    else if (any(dq /= q)) then
      status = shape_error(function, 'dq (head_dim, heads, seqlen_q, batch)', q, dq)
    else if (any(dk /= k)) then
      status = shape_error(function, 'dk (head_dim, kv_heads, seqlen_k, batch)', k, dk)
    else if (any(dv /= k)) then
      status = shape_error(function, 'dv (head_dim, kv_heads, seqlen_k, batch)', k, dv)
    end if
  end function

  ! q_shape (head_dim, heads, seqlen_q, batch), k_shape (head_dim, kv_heads,
  ! seqlen_k, batch).
  integer(c_int) function attention_forward(dtype, q, k, v, o, lse, q_shape, k_shape, &
      options) result(status)
    integer(c_int), intent(in) :: dtype
    type(c_ptr), intent(in) :: q, k, v, o, lse
    integer, intent(in) :: q_shape(4), k_shape(4)
    type(kfa_attention_options), intent(in), optional :: options
    type(kfa_attention_options), target :: local
    local = kfa_attention_options_default()
    if (present(options)) local = options
    status = kfa_c_attention_forward(KFA_SPACE_HOST, c_null_ptr, dtype, q, k, v, o, lse, &
      int(q_shape(4), c_int64_t), int(q_shape(3), c_int64_t), int(k_shape(3), c_int64_t), &
      int(q_shape(2), c_int64_t), int(k_shape(2), c_int64_t), int(q_shape(1), c_int64_t), &
      c_loc(local))
    if (status == KFA_SUCCESS) status = kfa_c_fence(KFA_SPACE_HOST, c_null_ptr)
  end function

  integer(c_int) function attention_backward_f32(q, k, v, o, lse, d_o, dq, dk, dv, options) &
      result(status)
    real(c_float), intent(in), target, contiguous :: q(:,:,:,:), k(:,:,:,:), v(:,:,:,:), &
      o(:,:,:,:), lse(:,:,:), d_o(:,:,:,:)
    real(c_float), intent(inout), target, contiguous :: dq(:,:,:,:), dk(:,:,:,:), dv(:,:,:,:)
    type(kfa_attention_options), intent(in), optional :: options
    call clear_fortran_error()
    status = check_attention('kfa_attention_backward', shape(q), shape(k), shape(v), shape(o), &
                             shape(lse), shape(d_o), shape(dq), shape(dk), shape(dv))
    if (status /= KFA_SUCCESS) return
    status = attention_backward(KFA_F32, c_loc(q), c_loc(k), c_loc(v), c_loc(o), c_loc(lse), &
      c_loc(d_o), c_loc(dq), c_loc(dk), c_loc(dv), shape(q), shape(k), options)
  end function

  integer(c_int) function attention_backward_f64(q, k, v, o, lse, d_o, dq, dk, dv, options) &
      result(status)
    real(c_double), intent(in), target, contiguous :: q(:,:,:,:), k(:,:,:,:), v(:,:,:,:), &
      o(:,:,:,:), lse(:,:,:), d_o(:,:,:,:)
    real(c_double), intent(inout), target, contiguous :: dq(:,:,:,:), dk(:,:,:,:), dv(:,:,:,:)
    type(kfa_attention_options), intent(in), optional :: options
    call clear_fortran_error()
    status = check_attention('kfa_attention_backward', shape(q), shape(k), shape(v), shape(o), &
                             shape(lse), shape(d_o), shape(dq), shape(dk), shape(dv))
    if (status /= KFA_SUCCESS) return
    status = attention_backward(KFA_F64, c_loc(q), c_loc(k), c_loc(v), c_loc(o), c_loc(lse), &
      c_loc(d_o), c_loc(dq), c_loc(dk), c_loc(dv), shape(q), shape(k), options)
  end function

  integer(c_int) function attention_backward(dtype, q, k, v, o, lse, d_o, dq, dk, dv, &
      q_shape, k_shape, options) result(status)
    integer(c_int), intent(in) :: dtype
    type(c_ptr), intent(in) :: q, k, v, o, lse, d_o, dq, dk, dv
    integer, intent(in) :: q_shape(4), k_shape(4)
    type(kfa_attention_options), intent(in), optional :: options
    type(kfa_attention_options), target :: local
    local = kfa_attention_options_default()
    if (present(options)) local = options
    status = kfa_c_attention_backward(KFA_SPACE_HOST, c_null_ptr, dtype, q, k, v, o, lse, &
      d_o, dq, dk, dv, int(q_shape(4), c_int64_t), int(q_shape(3), c_int64_t), &
      int(k_shape(3), c_int64_t), int(q_shape(2), c_int64_t), int(k_shape(2), c_int64_t), &
      int(q_shape(1), c_int64_t), c_loc(local))
    if (status == KFA_SUCCESS) status = kfa_c_fence(KFA_SPACE_HOST, c_null_ptr)
  end function

  ! ------------------------------------------------------------------ blocks

  !> A block of dtype KFA_F32 or KFA_F64 in `space` (default KFA_SPACE_HOST,
  !> which the array wrappers need; a KFA_SPACE_DEFAULT block on a GPU build
  !> takes device pointers through kfa_c_block_forward/backward).
  integer(c_int) function kfa_block_create(block, options, dtype, space) result(status)
    type(kfa_block), intent(out) :: block
    type(kfa_block_options), intent(in) :: options
    integer(c_int), intent(in) :: dtype
    integer(c_int), intent(in), optional :: space
    type(c_ptr) :: handle
    call clear_fortran_error()
    block%space = KFA_SPACE_HOST
    if (present(space)) block%space = space
    handle = c_null_ptr
    status = kfa_c_block_create(options, dtype, block%space, handle)
    if (status /= KFA_SUCCESS) return
    block%handle = handle
    block%dtype = dtype
    block%d_model = int(options%d_model, c_int64_t)
  end function

  !> A block in the sequence-parallel mode over `comm` (an MPI communicator's
  !> Fortran handle): every rank passes its own run of tokens of every
  !> sequence to kfa_block_forward/backward. Collective over comm.
  integer(c_int) function kfa_block_create_sequence_parallel(block, options, dtype, comm, &
      space) result(status)
    type(kfa_block), intent(out) :: block
    type(kfa_block_options), intent(in) :: options
    integer(c_int), intent(in) :: dtype
    integer, intent(in) :: comm
    integer(c_int), intent(in), optional :: space
    type(c_ptr) :: handle
    call clear_fortran_error()
    block%space = KFA_SPACE_HOST
    if (present(space)) block%space = space
    handle = c_null_ptr
    status = kfa_c_block_create_sequence_parallel(options, dtype, block%space, &
      int(comm, c_int32_t), handle)
    if (status /= KFA_SUCCESS) return
    block%handle = handle
    block%dtype = dtype
    block%d_model = int(options%d_model, c_int64_t)
  end function

  !> Every gradient of the block replaced by its mean (reduction absent or
  !> KFA_GRADIENT_MEAN: data parallelism) or sum (KFA_GRADIENT_SUM: the
  !> sequence-parallel mode) over the ranks of `comm`; deterministic adds the
  !> ranks in rank order. Collective over comm.
  integer(c_int) function kfa_block_allreduce_gradients(block, comm, reduction, deterministic) &
      result(status)
    type(kfa_block), intent(inout) :: block
    integer, intent(in) :: comm
    integer(c_int32_t), intent(in), optional :: reduction
    logical, intent(in), optional :: deterministic
    integer(c_int32_t) :: r, d
    call clear_fortran_error()
    r = KFA_GRADIENT_MEAN
    if (present(reduction)) r = reduction
    d = 0
    if (present(deterministic)) then
      if (deterministic) d = 1
    end if
    status = kfa_c_block_allreduce_gradients(block%handle, c_null_ptr, int(comm, c_int32_t), &
      r, d)
    if (status == KFA_SUCCESS) status = kfa_c_fence(block%space, c_null_ptr)
  end function

  integer(c_int) function kfa_block_destroy(block) result(status)
    type(kfa_block), intent(inout) :: block
    call clear_fortran_error()
    status = kfa_c_block_destroy(block%handle)
    if (status == KFA_SUCCESS) block%handle = c_null_ptr
  end function

  integer(c_int) function block_forward_f32(block, x, y, dropout_seed, training) result(status)
    type(kfa_block), intent(inout) :: block
    real(c_float), intent(in), target, contiguous :: x(:,:,:)
    real(c_float), intent(inout), target, contiguous :: y(:,:,:)
    integer(c_int64_t), intent(in), optional :: dropout_seed
    logical, intent(in), optional :: training
    call clear_fortran_error()
    status = block_forward(block, KFA_F32, c_loc(x), c_loc(y), shape(x), shape(y), &
                           dropout_seed, training)
  end function

  integer(c_int) function block_forward_f64(block, x, y, dropout_seed, training) result(status)
    type(kfa_block), intent(inout) :: block
    real(c_double), intent(in), target, contiguous :: x(:,:,:)
    real(c_double), intent(inout), target, contiguous :: y(:,:,:)
    integer(c_int64_t), intent(in), optional :: dropout_seed
    logical, intent(in), optional :: training
    call clear_fortran_error()
    status = block_forward(block, KFA_F64, c_loc(x), c_loc(y), shape(x), shape(y), &
                           dropout_seed, training)
  end function

  ! The arrays carry their shapes: x's goes to C, y's must match it.
  integer(c_int) function block_forward(block, dtype, x, y, x_shape, y_shape, dropout_seed, &
      training) result(status)
    type(kfa_block), intent(inout) :: block
    integer(c_int), intent(in) :: dtype
    type(c_ptr), intent(in) :: x, y
    integer, intent(in) :: x_shape(3), y_shape(3)
    integer(c_int64_t), intent(in), optional :: dropout_seed
    logical, intent(in), optional :: training
    integer(c_int64_t) :: seed
    integer(c_int32_t) :: train
    seed = 0
    if (present(dropout_seed)) seed = dropout_seed
    train = 1
    if (present(training)) then
      if (.not. training) train = 0
    end if
    if (any(x_shape /= y_shape)) then
      status = shape_error('kfa_block_forward', 'y (d_model, seqlen, batch)', x_shape, y_shape)
      return
    end if
    status = kfa_c_block_forward(block%handle, c_null_ptr, dtype, x, y, &
      int(x_shape(3), c_int64_t), int(x_shape(2), c_int64_t), int(x_shape(1), c_int64_t), &
      seed, train)
    if (status == KFA_SUCCESS) status = kfa_c_fence(block%space, c_null_ptr)
  end function

  integer(c_int) function block_backward_f32(block, dy, dx) result(status)
    type(kfa_block), intent(inout) :: block
    real(c_float), intent(in), target, contiguous :: dy(:,:,:)
    real(c_float), intent(inout), target, contiguous :: dx(:,:,:)
    call clear_fortran_error()
    status = block_backward(block, KFA_F32, c_loc(dy), c_loc(dx), shape(dy), shape(dx))
  end function

  integer(c_int) function block_backward_f64(block, dy, dx) result(status)
    type(kfa_block), intent(inout) :: block
    real(c_double), intent(in), target, contiguous :: dy(:,:,:)
    real(c_double), intent(inout), target, contiguous :: dx(:,:,:)
    call clear_fortran_error()
    status = block_backward(block, KFA_F64, c_loc(dy), c_loc(dx), shape(dy), shape(dx))
  end function

  integer(c_int) function block_backward(block, dtype, dy, dx, dy_shape, dx_shape) &
      result(status)
    type(kfa_block), intent(inout) :: block
    integer(c_int), intent(in) :: dtype
    type(c_ptr), intent(in) :: dy, dx
    integer, intent(in) :: dy_shape(3), dx_shape(3)
    if (any(dy_shape /= dx_shape)) then
      status = shape_error('kfa_block_backward', 'dx (d_model, seqlen, batch)', dy_shape, &
                           dx_shape)
      return
    end if
    status = kfa_c_block_backward(block%handle, c_null_ptr, dtype, dy, dx, &
      int(dy_shape(3), c_int64_t), int(dy_shape(2), c_int64_t), int(dy_shape(1), c_int64_t))
    if (status == KFA_SUCCESS) status = kfa_c_fence(block%space, c_null_ptr)
  end function

  integer(c_int) function kfa_block_zero_grad(block) result(status)
    type(kfa_block), intent(inout) :: block
    call clear_fortran_error()
    status = kfa_c_block_zero_grad(block%handle, c_null_ptr)
    if (status == KFA_SUCCESS) status = kfa_c_fence(block%space, c_null_ptr)
  end function

  !> One AdamW step (options absent: the defaults).
  integer(c_int) function kfa_block_adamw_step(block, options) result(status)
    type(kfa_block), intent(inout) :: block
    type(kfa_adamw_options), intent(in), optional :: options
    type(kfa_adamw_options), target :: local
    call clear_fortran_error()
    local = kfa_adamw_options_default()
    if (present(options)) local = options
    status = kfa_c_block_adamw_step(block%handle, c_null_ptr, c_loc(local))
    if (status == KFA_SUCCESS) status = kfa_c_fence(block%space, c_null_ptr)
  end function

  integer(c_int) function kfa_block_parameter_count(block, count) result(status)
    type(kfa_block), intent(in) :: block
    integer, intent(out) :: count
    integer(c_int32_t) :: n
    call clear_fortran_error()
    n = 0
    status = kfa_c_block_parameter_count(block%handle, n)
    count = int(n)
  end function

  !> The name of parameter `index`, 1-based.
  integer(c_int) function kfa_block_parameter_name(block, index, name) result(status)
    type(kfa_block), intent(in) :: block
    integer, intent(in) :: index
    character(len=:), allocatable, intent(out) :: name
    type(c_ptr) :: p
    call clear_fortran_error()
    p = c_null_ptr
    status = kfa_c_block_parameter_name(block%handle, int(index - 1, c_int32_t), p)
    name = c_string(p)
  end function

  integer(c_int) function block_parameter_ptr(block, name, value, grad, size) result(status)
    type(kfa_block), intent(in) :: block
    character(len=*), intent(in) :: name
    type(c_ptr), intent(out) :: value, grad
    integer(c_int64_t), intent(out) :: size
    call clear_fortran_error()
    value = c_null_ptr
    grad = c_null_ptr
    size = 0
    status = kfa_c_block_parameter(block%handle, trim(name)//c_null_char, value, grad, size)
  end function

  integer(c_int) function block_parameter_f32(block, name, value, grad) result(status)
    type(kfa_block), intent(in) :: block
    character(len=*), intent(in) :: name
    real(c_float), pointer, intent(out) :: value(:), grad(:)
    type(c_ptr) :: v, g
    integer(c_int64_t) :: size
    call clear_fortran_error()
    nullify(value, grad)
    status = host_parameter(block, KFA_F32, name, v, g, size)
    if (status /= KFA_SUCCESS) return
    call c_f_pointer(v, value, [size])
    call c_f_pointer(g, grad, [size])
  end function

  integer(c_int) function block_parameter_f64(block, name, value, grad) result(status)
    type(kfa_block), intent(in) :: block
    character(len=*), intent(in) :: name
    real(c_double), pointer, intent(out) :: value(:), grad(:)
    type(c_ptr) :: v, g
    integer(c_int64_t) :: size
    call clear_fortran_error()
    nullify(value, grad)
    status = host_parameter(block, KFA_F64, name, v, g, size)
    if (status /= KFA_SUCCESS) return
    call c_f_pointer(v, value, [size])
    call c_f_pointer(g, grad, [size])
  end function

  ! Fortran pointers need host memory and the block's kind.
  integer(c_int) function host_parameter(block, dtype, name, v, g, size) result(status)
    type(kfa_block), intent(in) :: block
    integer(c_int), intent(in) :: dtype
    character(len=*), intent(in) :: name
    type(c_ptr), intent(out) :: v, g
    integer(c_int64_t), intent(out) :: size
    if (dtype /= block%dtype .or. block%space /= KFA_SPACE_HOST) then
      fortran_error = 'kfa_block_parameter: value and grad pointers need a KFA_SPACE_HOST ' // &
                      'block of their kind (use the type(c_ptr) form otherwise)'
      status = KFA_ERROR_INVALID_ARGUMENT
      v = c_null_ptr
      g = c_null_ptr
      size = 0
      return
    end if
    status = block_parameter_ptr(block, name, v, g, size)
  end function

end module kfa
