! Trains one kfa TransformerBlock from Fortran (module kfa, fortran/kfa.f90):
! a Llama-style block (RMSNorm, SwiGLU, rotary embeddings, causal attention)
! fitted with AdamW to a fixed random target, printing the mean squared error
! per step; it fails unless the loss falls to a tenth.
!
! Arguments (optional, in order): steps, seqlen.
program fortran_block
  use, intrinsic :: iso_c_binding
  use kfa
  implicit none

  integer, parameter :: batch = 2, heads = 4, head_dim = 8, d_model = heads * head_dim
  integer :: steps = 30, seqlen = 16
  real(c_float), allocatable, target :: x(:,:,:), y(:,:,:), dy(:,:,:), dx(:,:,:), goal(:,:,:)
  type(kfa_block) :: block
  type(kfa_block_options) :: options
  type(kfa_adamw_options) :: adamw
  real(c_float), pointer :: w1(:), w1_grad(:)
  character(len=:), allocatable :: name
  character(len=32) :: argument
  integer :: step, count, i
  real(c_double) :: loss, first

  if (command_argument_count() >= 1) then
    call get_command_argument(1, argument)
    read(argument, *) steps
  end if
  if (command_argument_count() >= 2) then
    call get_command_argument(2, argument)
    read(argument, *) seqlen
  end if

  call check(kfa_initialize())

  options = kfa_block_options_default()
  options%d_model = d_model
  options%heads = heads
  options%d_ff = 2 * d_model
  options%norm = KFA_RMS_NORM
  options%activation = KFA_SWIGLU
  options%bias = 0
  options%rotary = 1
  options%attention%causal = 1
  call check(kfa_block_create(block, options, KFA_F32))

  call check(kfa_block_parameter_count(block, count))
  do i = 1, count
    call check(kfa_block_parameter_name(block, i, name))
    print '(a, i0, a, a)', 'parameter ', i, ': ', name
  end do
  ! Parameters are plain arrays of a host block: here linear1's weight
  ! (SwiGLU: 2·d_ff rows of d_model).
  call check(kfa_block_parameter(block, 'linear1.weight', w1, w1_grad))
  print '(a, i0, a)', 'linear1.weight has ', size(w1), ' values'

  ! Column-major: the C tensor [batch][seqlen][d_model] is x(d_model, seqlen, batch).
  allocate(x(d_model, seqlen, batch), y(d_model, seqlen, batch), dy(d_model, seqlen, batch), &
           dx(d_model, seqlen, batch), goal(d_model, seqlen, batch))
  call fill(x, 1.0, 42)
  call fill(goal, 0.5, 7)

  adamw = kfa_adamw_options_default()
  adamw%lr = 1e-2
  adamw%weight_decay = 0
  first = 0
  do step = 1, steps
    call check(kfa_block_zero_grad(block))
    call check(kfa_block_forward(block, x, y, dropout_seed=int(step, c_int64_t)))
    ! Mean squared error and its gradient dL/dy = 2·(y - goal)/n.
    loss = sum(real(y - goal, c_double)**2) / size(y)
    dy = 2 * (y - goal) / size(y)
    call check(kfa_block_backward(block, dy, dx))
    call check(kfa_block_adamw_step(block, adamw))
    if (step == 1) first = loss
    print '(a, i3, a, f10.6)', 'step ', step, '  loss ', loss
  end do

  call check(kfa_block_destroy(block))
  call check(kfa_finalize())
  if (loss < 0.1 * first) then
    print '(a, f10.6, a, f10.6, a, i0, a)', 'ok: loss ', first, ' -> ', loss, ' over ', steps, &
      ' steps'
  else
    print '(a, f10.6, a, f10.6)', 'FAILED: loss ', first, ' -> ', loss
    error stop 1
  end if

contains

  subroutine check(status)
    integer(c_int), intent(in) :: status
    if (status /= KFA_SUCCESS) then
      print '(a, i0, a, a)', 'kfa error ', status, ': ', kfa_last_error()
      error stop 1
    end if
  end subroutine

  ! Normal values of standard deviation `scale` from a fixed seed (Box-Muller
  ! on a linear congruential generator, so every compiler draws the same).
  subroutine fill(a, scale, seed)
    real(c_float), intent(out) :: a(:,:,:)
    real, intent(in) :: scale
    integer, intent(in) :: seed
    integer(c_int64_t) :: state
    real(c_double) :: u1, u2
    integer :: i, j, k
    state = seed
    do k = 1, size(a, 3)
      do j = 1, size(a, 2)
        do i = 1, size(a, 1)
          u1 = next(state)
          u2 = next(state)
          a(i, j, k) = real(scale * sqrt(-2 * log(u1)) * cos(6.283185307179586d0 * u2), c_float)
        end do
      end do
    end do
  end subroutine

  real(c_double) function next(state)
    integer(c_int64_t), intent(inout) :: state
    state = modulo(state * 48271_c_int64_t, 2147483647_c_int64_t)
    next = real(state, c_double) / 2147483647d0
  end function

end program fortran_block
