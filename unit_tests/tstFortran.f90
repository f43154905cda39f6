! The Fortran module's array wrappers: index order (column-major arrays to
! C's row-major tensors, grouped-query heads) against a closed form, the
! same results as the type(c_ptr) interface, and the errors the wrappers
! add (shapes the arrays carry) or pass on (the C side's messages).
!
! Closed form: with q = 0 every score is 0, so P is uniform over the keys:
! o_i = mean_j v_j, lse = log(seqlen_k), dv_j = sum_i dO_i / seqlen_k over
! the query heads of the group, dk = 0, and dq_i = scale·sum_j dS_ij k_j with
! dS_ij = (dP_ij - mean_j dP_ij) / seqlen_k, dP_ij = dO_i·v_j.
program tst_fortran
  use, intrinsic :: iso_c_binding
  use kfa
  implicit none

  integer, parameter :: d = 5, h = 4, hkv = 2, sq = 7, sk = 9, b = 2
  real(c_double), allocatable, target :: q(:,:,:,:), k(:,:,:,:), v(:,:,:,:), o(:,:,:,:), &
    lse(:,:,:), d_o(:,:,:,:), dq(:,:,:,:), dk(:,:,:,:), dv(:,:,:,:)
  real(c_double), allocatable :: want_o(:,:,:,:), want_dv(:,:,:,:), want_dq(:,:,:,:), dp(:)
  real(c_float), allocatable, target :: qf(:,:,:,:), kf(:,:,:,:), vf(:,:,:,:), of(:,:,:,:), &
    lsef(:,:,:), of2(:,:,:,:), lsef2(:,:,:), wrong(:,:,:,:)
  real(c_float), allocatable, target :: x(:,:,:), y(:,:,:), y_short(:,:,:)
  real(c_double), pointer :: w64(:), g64(:)
  type(kfa_attention_options), target :: options
  type(kfa_block_options) :: block_options
  type(kfa_block) :: block
  integer :: failures = 0, bi, hi, g, i, j
  real(c_double) :: scale

  call expect(kfa_initialize(), KFA_SUCCESS, '', 'kfa_initialize')

  allocate(q(d, h, sq, b), k(d, hkv, sk, b), v(d, hkv, sk, b), o(d, h, sq, b), lse(sq, h, b), &
           d_o(d, h, sq, b), dq(d, h, sq, b), dk(d, hkv, sk, b), dv(d, hkv, sk, b))
  q = 0
  call random_fill(k, 1)
  call random_fill(v, 2)
  call random_fill(d_o, 3)
  call expect(kfa_attention_forward(q, k, v, o, lse), KFA_SUCCESS, '', 'forward f64')
  call expect(kfa_attention_backward(q, k, v, o, lse, d_o, dq, dk, dv), KFA_SUCCESS, '', &
              'backward f64')

  ! Query head hi reads key/value head g = (hi - 1) / (h / hkv) + 1.
  scale = 1 / sqrt(real(d, c_double))
  allocate(want_o, mold=o)
  allocate(want_dq, mold=dq)
  allocate(want_dv, mold=dv)
  allocate(dp(sk))
  want_dv = 0
  do bi = 1, b
    do hi = 1, h
      g = (hi - 1) / (h / hkv) + 1
      do i = 1, sq
        want_o(:, hi, i, bi) = sum(v(:, g, :, bi), dim=2) / sk
        do j = 1, sk
          dp(j) = dot_product(d_o(:, hi, i, bi), v(:, g, j, bi))
          want_dv(:, g, j, bi) = want_dv(:, g, j, bi) + d_o(:, hi, i, bi) / sk
        end do
        dp = (dp - sum(dp) / sk) / sk
        want_dq(:, hi, i, bi) = scale * matmul(k(:, g, :, bi), dp)
      end do
    end do
  end do
  call check(maxval(abs(o - want_o)) < 1d-13, 'o = mean of v (column-major order, grouped heads)')
  call check(maxval(abs(lse - log(real(sk, c_double)))) < 1d-13, 'lse = log(seqlen_k)')
  call check(maxval(abs(dv - want_dv)) < 1d-13, 'dv = sum of dO / seqlen_k over the group')
  call check(maxval(abs(dk)) == 0, 'dk = 0')
  call check(maxval(abs(dq - want_dq)) < 1d-13, 'dq in closed form')

  ! The array wrappers and the type(c_ptr) interface: the same call.
  allocate(qf(d, h, sq, b), kf(d, hkv, sk, b), vf(d, hkv, sk, b), of(d, h, sq, b), &
           lsef(sq, h, b), of2(d, h, sq, b), lsef2(sq, h, b))
  call random_fill_f32(qf, 4)
  call random_fill_f32(kf, 5)
  call random_fill_f32(vf, 6)
  options = kfa_attention_options_default()
  options%causal = 1
  options%softcap = 3
  call expect(kfa_attention_forward(qf, kf, vf, of, lsef, options), KFA_SUCCESS, '', &
              'forward f32 causal softcap')
  call expect(kfa_c_attention_forward(KFA_SPACE_HOST, c_null_ptr, KFA_F32, c_loc(qf), &
    c_loc(kf), c_loc(vf), c_loc(of2), c_loc(lsef2), int(b, c_int64_t), int(sq, c_int64_t), &
    int(sk, c_int64_t), int(h, c_int64_t), int(hkv, c_int64_t), int(d, c_int64_t), &
    c_loc(options)), KFA_SUCCESS, '', 'kfa_c_attention_forward')
  call expect(kfa_fence(KFA_SPACE_HOST), KFA_SUCCESS, '', 'kfa_fence')
  call check(all(of == of2) .and. all(lsef == lsef2), 'array wrapper = type(c_ptr) interface')
  call check(len(kfa_last_error()) == 0, 'a success leaves no message')

  ! Errors: shapes the arrays carry, and the C side's messages passed on.
  allocate(wrong(d, h, sq + 1, b))
  call expect(kfa_attention_forward(qf, kf, vf, wrong, lsef), KFA_ERROR_INVALID_ARGUMENT, &
    'kfa_attention_forward: o (head_dim, heads, seqlen_q, batch) must have the shape (5,4,7,2)', &
    'forward with o of another shape')
  call expect(kfa_attention_forward(qf, kf, vf, of, lsef(1:sq - 1, :, :)), &
    KFA_ERROR_INVALID_ARGUMENT, 'lse (seqlen_q, heads, batch) must have the shape (7,4,2)', &
    'forward with lse of another shape')
  call expect(kfa_attention_forward(qf, vf(:, :, 1:sk - 1, :), vf, of, lsef), &
    KFA_ERROR_INVALID_ARGUMENT, 'v (head_dim, kv_heads, seqlen_k, batch)', &
    'forward with k and v of other lengths')
  call expect(kfa_attention_forward(qf(:, 1:3, :, :), kf, vf, of(:, 1:3, :, :), &
    lsef(:, 1:3, :)), KFA_ERROR_INVALID_ARGUMENT, &
    'kfa_attention_forward: heads (3) must be a multiple of kv_heads (2)', &
    'forward with 3 heads over 2 (the C check)')
  call expect(kfa_attention_backward(q, k, v, o, lse, d_o, dq, dk, dv(:, :, 1:2, :)), &
    KFA_ERROR_INVALID_ARGUMENT, 'dv (head_dim, kv_heads, seqlen_k, batch)', &
    'backward with dv of another shape')
  call expect(kfa_attention_forward(qf, kf, vf, of, lsef), KFA_SUCCESS, '', &
    'a success after an error')
  call check(len(kfa_last_error()) == 0, 'a success clears the Fortran-side message')

  block_options = kfa_block_options_default()
  block_options%d_model = 12
  block_options%heads = 3
  block_options%d_ff = 16
  call expect(kfa_block_create(block, block_options, KFA_F32), KFA_SUCCESS, '', 'block create')
  allocate(x(12, 5, 2), y(12, 5, 2), y_short(12, 4, 2))
  call random_fill3(x, 7)
  call expect(kfa_block_forward(block, x, y_short), KFA_ERROR_INVALID_ARGUMENT, &
    'kfa_block_forward: y (d_model, seqlen, batch) must have the shape (12,5,2), got (12,4,2)', &
    'block forward with y of another shape')
  call expect(kfa_block_forward(block, x(1:11, :, :), y(1:11, :, :)), &
    KFA_ERROR_INVALID_ARGUMENT, 'd_model must be the block''s 12, got 11', &
    'block forward with d_model 11 (the C check)')
  call expect(kfa_block_parameter(block, 'linear1.weight', w64, g64), &
    KFA_ERROR_INVALID_ARGUMENT, 'need a KFA_SPACE_HOST block of their kind', &
    'real(c_double) pointers to an f32 block')
  call expect(kfa_block_destroy(block), KFA_SUCCESS, '', 'block destroy')
  call expect(kfa_finalize(), KFA_SUCCESS, '', 'kfa_finalize')

  if (failures > 0) then
    print '(a, i0, a)', 'FAILED: ', failures, ' failure(s)'
    error stop 1
  end if
  print '(a)', 'ok: 0 failure(s)'

contains

  subroutine check(ok, what)
    logical, intent(in) :: ok
    character(len=*), intent(in) :: what
    if (ok) then
      print '(a, a)', 'ok  ', what
    else
      failures = failures + 1
      print '(a, a)', 'FAILED ', what
    end if
  end subroutine

  ! Status `want`, and a message containing `needle` (none for a success).
  subroutine expect(status, want, needle, what)
    integer(c_int), intent(in) :: status, want
    character(len=*), intent(in) :: needle, what
    character(len=:), allocatable :: message
    message = kfa_last_error()
    if (status /= want .or. index(message, needle) == 0) then
      failures = failures + 1
      print '(a, a, a, i0, a, i0, a, a)', 'FAILED ', what, ': status ', status, ' (want ', &
        want, '), message ', message
    else if (want /= KFA_SUCCESS) then
      print '(a, a, a, a)', 'ok  ', what, ': ', message
    end if
  end subroutine

  ! Values in [-1, 1) from a fixed seed (the same on every compiler).
  real(c_double) function next(state)
    integer(c_int64_t), intent(inout) :: state
    state = modulo(state * 48271_c_int64_t, 2147483647_c_int64_t)
    next = 2 * real(state, c_double) / 2147483647d0 - 1
  end function

  subroutine random_fill(a, seed)
    real(c_double), intent(out) :: a(:,:,:,:)
    integer, intent(in) :: seed
    integer(c_int64_t) :: state
    integer :: i1, i2, i3, i4
    state = seed
    do i4 = 1, size(a, 4)
      do i3 = 1, size(a, 3)
        do i2 = 1, size(a, 2)
          do i1 = 1, size(a, 1)
            a(i1, i2, i3, i4) = next(state)
          end do
        end do
      end do
    end do
  end subroutine

  subroutine random_fill_f32(a, seed)
    real(c_float), intent(out) :: a(:,:,:,:)
    integer, intent(in) :: seed
    real(c_double), allocatable :: t(:,:,:,:)
    allocate(t(size(a, 1), size(a, 2), size(a, 3), size(a, 4)))
    call random_fill(t, seed)
    a = real(t, c_float)
  end subroutine

  subroutine random_fill3(a, seed)
    real(c_float), intent(out) :: a(:,:,:)
    integer, intent(in) :: seed
    real(c_double), allocatable :: t(:,:,:,:)
    allocate(t(size(a, 1), size(a, 2), size(a, 3), 1))
    call random_fill(t, seed)
    a = real(t(:, :, :, 1), c_float)
  end subroutine

end program tst_fortran
