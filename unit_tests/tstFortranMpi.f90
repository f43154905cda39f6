!> The Fortran module's communicator functions under mpiexec: a block in the
!> sequence-parallel mode on each rank's run of tokens (an MPI_COMM_WORLD
!> handle from `use mpi`) against a single-rank block on the whole sequence,
!> gradients summed with kfa_block_allreduce_gradients; the mean of
!> data-parallel gradients; a bad communicator.
program tst_fortran_mpi
  use, intrinsic :: iso_c_binding
  use mpi
  use kfa
  implicit none

  integer, parameter :: d = 12, s = 11, b = 2
  type(kfa_block) :: single, parallel, bad
  type(kfa_block_options) :: options
  real(c_double), allocatable, target :: x(:,:,:), dy(:,:,:), y(:,:,:), dx(:,:,:)
  real(c_double), allocatable, target :: xl(:,:,:), dyl(:,:,:), yl(:,:,:), dxl(:,:,:)
  real(c_double), allocatable :: g_single(:), g_parallel(:), g_mean(:)
  integer :: ierr, rank, ranks, len, offset, r, failures, all_failures

  call mpi_init(ierr)
  call mpi_comm_rank(MPI_COMM_WORLD, rank, ierr)
  call mpi_comm_size(MPI_COMM_WORLD, ranks, ierr)
  failures = 0
  call expect(kfa_initialize(), KFA_SUCCESS, '', 'kfa_initialize')

  options = kfa_block_options_default()
  options%d_model = d
  options%heads = 3
  options%d_ff = 20
  options%rotary = 1
  options%attention%causal = 1
  options%init_seed = 5
  allocate(x(d, s, b), dy(d, s, b), y(d, s, b), dx(d, s, b))
  call random_fill(x, 3)
  call random_fill(dy, 4)

  ! The whole sequence on every rank.
  call expect(kfa_block_create(single, options, KFA_F64), KFA_SUCCESS, '', 'create single')
  call expect(kfa_block_forward(single, x, y), KFA_SUCCESS, '', 'single forward')
  call expect(kfa_block_backward(single, dy, dx), KFA_SUCCESS, '', 'single backward')
  g_single = gradients(single)

  ! This rank's contiguous run of tokens of every sequence.
  offset = 0
  do r = 0, rank - 1
    offset = offset + s / ranks + merge(1, 0, r < mod(s, ranks))
  end do
  len = s / ranks + merge(1, 0, rank < mod(s, ranks))
  allocate(xl(d, len, b), dyl(d, len, b), yl(d, len, b), dxl(d, len, b))
  xl = x(:, offset + 1:offset + len, :)
  dyl = dy(:, offset + 1:offset + len, :)
  call expect(kfa_block_create_sequence_parallel(parallel, options, KFA_F64, MPI_COMM_WORLD), &
    KFA_SUCCESS, '', 'create sequence parallel')
  call expect(kfa_block_forward(parallel, xl, yl), KFA_SUCCESS, '', 'parallel forward')
  call expect(kfa_block_backward(parallel, dyl, dxl), KFA_SUCCESS, '', 'parallel backward')
  call expect(kfa_block_allreduce_gradients(parallel, MPI_COMM_WORLD, KFA_GRADIENT_SUM), &
    KFA_SUCCESS, '', 'allreduce sum')
  g_parallel = gradients(parallel)
  call check(maxval(abs(yl - y(:, offset + 1:offset + len, :))) <= 1d-13 * &
    max(1d0, maxval(abs(y))), 'sequence-parallel y')
  call check(maxval(abs(dxl - dx(:, offset + 1:offset + len, :))) <= 1d-13 * &
    max(1d0, maxval(abs(dx))), 'sequence-parallel dx')
  call check(size(g_parallel) == size(g_single), 'same parameters')
  if (size(g_parallel) == size(g_single)) then
    call check(maxval(abs(g_parallel - g_single)) <= 1d-12 * max(1d0, maxval(abs(g_single))), &
      'sequence-parallel gradients summed')
  end if

  ! Data parallelism: rank r's gradients are (r + 1) times the single
  ! block's; their mean is (ranks + 1)/2 times them.
  call expect(kfa_block_zero_grad(single), KFA_SUCCESS, '', 'zero_grad')
  call expect(kfa_block_forward(single, x, y), KFA_SUCCESS, '', 'forward')
  dy = dy * (rank + 1)
  call expect(kfa_block_backward(single, dy, dx), KFA_SUCCESS, '', 'backward')
  call expect(kfa_block_allreduce_gradients(single, MPI_COMM_WORLD), KFA_SUCCESS, '', &
    'allreduce mean')
  g_mean = gradients(single)
  call check(maxval(abs(g_mean - g_single * (ranks + 1) / 2d0)) <= 1d-13 * &
    max(1d0, maxval(abs(g_single))), 'data-parallel mean')

  call expect(kfa_block_create_sequence_parallel(bad, options, KFA_F64, MPI_COMM_NULL), &
    KFA_ERROR_INVALID_ARGUMENT, 'is MPI_COMM_NULL', 'MPI_COMM_NULL')
  call expect(kfa_block_allreduce_gradients(single, MPI_COMM_WORLD, 5_c_int32_t), &
    KFA_ERROR_INVALID_ARGUMENT, 'reduction must be KFA_GRADIENT_MEAN or KFA_GRADIENT_SUM', &
    'bad reduction')
  call check(all(gradients(single) == g_mean), 'gradients untouched by the failed call')

  call expect(kfa_block_destroy(parallel), KFA_SUCCESS, '', 'destroy parallel')
  call expect(kfa_block_destroy(single), KFA_SUCCESS, '', 'destroy single')
  call expect(kfa_finalize(), KFA_SUCCESS, '', 'kfa_finalize')
  call mpi_allreduce(failures, all_failures, 1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
  if (rank == 0) print '(a, i0, a, i0, a)', 'tst_fortran_mpi: ', all_failures, &
    ' failure(s) over ', ranks, ' rank(s)'
  call mpi_finalize(ierr)
  if (all_failures > 0) error stop 1

contains

  subroutine check(ok, what)
    logical, intent(in) :: ok
    character(len=*), intent(in) :: what
    if (.not. ok) then
      failures = failures + 1
      print '(a, i0, 2a)', 'rank ', rank, ' FAILED ', what
    end if
  end subroutine

  !> status `want` and a message containing `needle`.
  subroutine expect(status, want, needle, what)
    integer(c_int), intent(in) :: status, want
    character(len=*), intent(in) :: needle, what
    character(len=:), allocatable :: message
    message = kfa_last_error()
    if (status /= want .or. index(message, needle) == 0) then
      failures = failures + 1
      print '(a, i0, 3a, i0, 3a)', 'rank ', rank, ' FAILED ', what, ': status ', status, &
        ' "', message, '"'
    end if
  end subroutine

  !> Every gradient of a host f64 block, in parameter order.
  function gradients(block) result(all)
    type(kfa_block), intent(in) :: block
    real(c_double), allocatable :: all(:)
    real(c_double), pointer :: value(:), grad(:)
    character(len=:), allocatable :: name
    integer :: count, n
    integer(c_int) :: status
    allocate(all(0))
    status = kfa_block_parameter_count(block, count)
    do n = 1, count
      status = kfa_block_parameter_name(block, n, name)
      status = kfa_block_parameter(block, name, value, grad)
      if (status /= KFA_SUCCESS) then
        call check(.false., 'parameter ' // name)
        cycle
      end if
      all = [all, grad]
    end do
  end function

  subroutine random_fill(a, seed)
    real(c_double), intent(out) :: a(:,:,:)
    integer, intent(in) :: seed
    integer(c_int64_t) :: state
    integer :: i1, i2, i3
    state = seed
    do i3 = 1, size(a, 3)
      do i2 = 1, size(a, 2)
        do i1 = 1, size(a, 1)
          state = modulo(state * 48271_c_int64_t, 2147483647_c_int64_t)
          a(i1, i2, i3) = 2 * real(state, c_double) / 2147483647d0 - 1
        end do
      end do
    end do
  end subroutine

end program tst_fortran_mpi
